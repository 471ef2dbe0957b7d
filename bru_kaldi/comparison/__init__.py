"""Comparing unit types over seeds: ``compare.py``'s library.

=================  ===========================================================================
``sweep``          every (config, seed) through ``run_exp.py``, each into its own folder, resumable
``runs``           experiment folders read back as runs, grouped into systems (one config, its seeds)
``statistics``     bootstrap intervals over utterances and seeds, the run-level test (variance
                   components, P(better), power), matched-pairs and sign tests
``report``         the table (text, Markdown, CSV)
``figures``        errors with intervals, dev curves, error against parameters and training time
=================  ===========================================================================
"""
