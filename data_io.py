"""Kaldi data and alignment directories in, training batches out; network outputs back as Kaldi archives.

The user's entry point to the data pipeline, as in pytorch-kaldi: ``import data_io`` gives every piece,
which lives in the library (``bru_kaldi.corpus``, ``bru_kaldi.posteriors`` and the modules they use).
Works with or without a Kaldi installation. The pieces, in the order data flows:

1. Parameters: a data set is the config's own :class:`Dataset` (one schema for ``[datasetN]`` and for
   the loader, with pytorch-kaldi's names: ``fea_name``, ``fea_lst``, ``fea_opts``, ``cw_left``,
   ``cw_right``; ``lab_name``, ``lab_folder``, ``lab_opts``, ``lab_count_file``; ``n_chunks``);
   :func:`dataset_for` picks the streams a model uses; :class:`LoaderOptions` holds batching and checks
   (:func:`loader_options` from ``[batches]``).
2. Labels (``bru_kaldi.kaldi.alignments``): ``ali.*.gz`` transition-ids become pdf-ids
   (``ali-to-pdf``) or per-frame phones (``ali-to-phones --per-frame=true``) through the
   TransitionModel of ``final.mdl`` (:func:`read_transition_model`), kept in a memory-mapped temporary
   file so that a corpus larger than memory costs only its index.
3. Features: each stream is an scp (random access, header-only indexing) or any rspecifier or Kaldi
   pipeline (``ark:copy-feats ... |``, exit status checked; ``bru_kaldi.kaldi.tables``),
   post-processed by its ``fea_opts`` (CMVN per speaker or utterance, deltas; see
   ``bru_kaldi.feature_transforms``) and spliced with ``cw_left``/``cw_right``; streams are
   concatenated per frame.
4. :class:`Corpus` joins streams and labels (missing utterances skipped and counted, an error above
   ``max_missing_fraction``; lengths checked up front), cuts the corpus into ``n_chunks`` chunks
   (re-drawn every epoch from the seed), loads one chunk while the next is prepared in a background
   thread, and yields padded batches of length-sorted utterances (:class:`Batch`, ``bru_kaldi.batching``).
5. Outputs: :func:`log_priors` from pdf counts (``analyze-counts``) and :class:`LoglikeWriter`,
   which writes log posteriors minus log priors as a float32 ``ark`` + ``scp``, atomically.

Errors are :class:`KaldiIOError`, naming the file, the utterance and what was expected.

>>> import tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> with ArkWriter(f"{d}/feats.ark", f"{d}/feats.scp") as w:
...     for i in range(5):
...         w.write(f"utt{i}", np.random.rand(10 + i, 13))
>>> corpus = Corpus(Dataset("test", [FeatureStream("mfcc", f"{d}/feats.scp", "cmvn=utterance", 1, 1)]),
...                 LoaderOptions(batch_size=2, shuffle=False))
>>> [(tuple(b.x.shape), b.keys) for b in corpus.batches()]
[((2, 11, 39), ['utt0', 'utt1']), ((2, 13, 39), ['utt2', 'utt3']), ((1, 14, 39), ['utt4'])]
"""

from bru_kaldi.batching import IGNORE, Batch
from bru_kaldi.config import Dataset, FeatureStream, LabelStream
from bru_kaldi.corpus import Corpus, LoaderOptions, dataset_for, fingerprint, label_names, loader_options
from bru_kaldi.feature_transforms import GlobalNorm
from bru_kaldi.kaldi.alignments import AlignmentStore, alignment_files, hmm_info, label_kind, read_alignments
from bru_kaldi.kaldi.tables import ArkWriter, KaldiIOError, ScpTable, read_int_vectors, read_matrices
from bru_kaldi.kaldi.transition_model import TransitionModel, read_transition_model, write_transition_model
from bru_kaldi.posteriors import PRIOR_FLOOR, LoglikeWriter, log_priors, read_counts, write_counts

__all__ = ["KaldiIOError", "FeatureStream", "LabelStream", "Dataset", "LoaderOptions", "Corpus", "Batch",
           "IGNORE", "GlobalNorm", "TransitionModel", "read_transition_model", "write_transition_model",
           "read_matrices", "read_int_vectors", "read_alignments", "alignment_files", "AlignmentStore", "ScpTable",
           "ArkWriter", "LoglikeWriter", "read_counts", "write_counts", "log_priors", "PRIOR_FLOOR", "hmm_info",
           "label_kind", "dataset_for", "label_names", "loader_options", "fingerprint"]
