"""bru-kaldi's library: everything between a config file and the error rates, except the units
(``models/``), which stand alone. ``data_io.py`` at the top level is the users' door into the data
pipeline below (``corpus``, ``posteriors`` and what they use), as in pytorch-kaldi.

In the order a run uses them (``run_exp.py``), each module one job:

=========================  =========================================================================
``config``                 the INI config parsed once into typed, validated dataclasses (no torch)
``pytorch_kaldi/``         pytorch-kaldi's own configs translated into ours (sections, architectures,
                           the ``[model] model=`` program), read by ``config`` (no torch)
``schedules``              per-epoch values: progressive rates and batch sizes, the length curriculum
``builtin_corpus``         the hook that builds the built-in corpus by running its recipe's ``run.sh``
``kaldi/``                 Kaldi's files without Kaldi: ``rspecifiers`` (files and checked pipes),
                           ``tables`` (ark/scp), ``transition_model`` (``final.mdl``), ``alignments``
``frontend``               Kaldi's fbank and MFCC (kaldi-native-fbank) as ``conf/fbank.conf`` describes them
``feature_transforms``     ``apply-cmvn``, ``add-deltas``, splicing, the global normalisation; online CMVN
                           and context for frames as they arrive
``feature_streams``        one feature stream as the loader reads it (index, CMVN, post-processing)
``batching``               utterances into padded batches; the background chunk prefetcher
``corpus``                 a data set read chunk by chunk: streams and labels joined, checked, batched
``network``                the acoustic model a config describes; where unit names and options are checked
``learning_rate``          each architecture's rate at each step: schedule, halving, rollbacks, warmup
``training``               the loss, optimisers, seeds, the end of an epoch, the learning curve
``checkpoints``            where a run stands, saved atomically and loaded with ``weights_only``
``chain/``                 LF-MMI: the phone LM, the denominator and numerator graphs, the objective
``distributed``            this process's place in a ``torchrun`` job
``experiment``             the experiment folder: paths, stage markers, ``res.res``, resume rules
``posteriors``             pdf counts, log priors, log-likelihood archives for the decoders
``decoding/``              log-likelihoods to words: one utterance, whole sets, the Python decoder,
                           the Kaldi-script path
``scoring``                WER/PER as Kaldi's ``compute-wer``, per-utterance counts; the scoring filter a
                           config names, read from its corpus's recipe (``recipes/<corpus>/``)
``comparison/``            ``compare.py``'s sweeps over seeds, statistics, tables and figures
``records``                what an experiment folder keeps for new audio: its front end, the chosen decoding
``audio``                  WAV files and raw PCM, checked, as int16-scale samples at the model's rate
``transcription``          ``transcribe.py``'s work: a trained model on new audio, offline
``streaming``              the same as the audio arrives: features, network and decoder chunk by chunk
``atomic``                 the one way files are written: whole or not at all
=========================  =========================================================================

Dependencies point down: ``run_exp.py``, ``compare.py``, ``transcribe.py`` and ``data_io.py`` -> this package
-> ``models/``, which stands alone. Three modules here import ``models``: ``network`` (the units), ``chain.native``
(the C++ build machinery, ``models.fast.native``) and ``chain.triton_fb`` (the Triton launch machinery,
``models.fast.triton_loops``); nothing here imports a recipe or ``data_io`` (a recipe's data files, such
as its scoring filter, are read by path).
"""
