"""Lattice-free MMI ("chain" training): the denominator and numerator forward-backward, and the objective.

The mathematical core of LF-MMI as Kaldi's chain training computes it, written anew in PyTorch from
the maths (Povey et al., 2016). Every arc of a graph emits exactly one frame; the recursions run in
the probability domain with per-frame renormalisation: on a CPU as a C++ op, a thread per utterance,
elsewhere as torch ops vectorised over the batch, on any device.

=================  ==========================================================================
``phone_lm``       the phone n-gram of the training alignments' phone sequences (the denominator's LM)
``den_graph``      the denominator graph: that LM composed with the HMMs, one arc per frame, weighted as
                   Kaldi's H transducer and the chain decoding graph; written and read as Kaldi's
                   ``den.fst`` (OpenFst)
``graph``          the graphs: :class:`~bru_kaldi.chain.graph.ChainGraph` (one FSA: arcs with
                   pdf-ids and weights, initial and final weights, time windows),
                   :class:`~bru_kaldi.chain.graph.GraphBatch` (graphs of different sizes padded into one
                   batch), and the denominator graph's initial probabilities (Kaldi's ``SetInitialProbs``)
``numerator``      an utterance's numerator graph from its alignment, as Kaldi's ``chain-get-supervision``:
                   its phones with a tolerance, through the HMMs, at the frame subsampling factor
``supervision``    a training set's denominator (estimated, or a ``den.fst``), a batch's numerators and
                   loss, and the setup of ``[model] objective = lfmmi`` from a config
``objective``      the forward-backward over a batch (denominator with the leaky HMM, numerator),
                   the chain objective with its hand-written gradient ``num_post - den_post``,
                   and :func:`~bru_kaldi.chain.objective.lfmmi_loss` with cross-entropy and L2
                   regularisation
``native``         the C++ forward-backward for CPU tensors (``csrc/forward_backward.cpp``), built on
                   first use
=================  ==========================================================================
"""
