"""Decoding: per-pdf log-likelihoods to word (or phone) strings, one utterance or whole data sets.

========================  ====================================================================
``utterance``             one utterance, without Kaldi: :func:`decode` (kaldi-hmm-gmm's FasterDecoder
                          through HCLG.fst), :class:`DecoderOptions`, word insertion penalties
``ctm``                   word timings of a best path (``lattice-align-words``, ``nbest-to-ctm``)
``sets``                  whole sets: :class:`DecodeJob`, the input checks, the reports
                          (:class:`SetResult`, the line ``res.res`` keeps)
``grid``                  the settings tried on the tuning set, grown past an edge the best sits on
``python_decoder``        the sets with the decoder above, in parallel over utterances
``kaldi_scripts``         the sets with Kaldi's binaries (``kaldi_decoding_scripts/``)
========================  ====================================================================

:func:`decode_sets` (what ``run_exp.py`` calls) decodes every set of a :class:`DecodeJob` list, with
Kaldi's binaries where they are installed and with the Python decoder otherwise. The setting (the
acoustic scale, or Kaldi's LM weight and insertion penalty) is chosen on one set (dev) and applied
unchanged to the others; results come back as :class:`SetResult` and are written under each job's
``out_dir``.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from bru_kaldi.config import Decoding
from bru_kaldi.decoding.kaldi_scripts import KALDI_BINARIES, choose_decoder, decode_kaldi
from bru_kaldi.decoding.python_decoder import decode_python
from bru_kaldi.decoding.sets import (FRAME_SHIFT, GRAPHS, DecodeInputError, DecodeJob, GraphMismatchError,
                                     KaldiDecodeError,
                                     KaldiNotFoundError, MissingInputError, SetResult, check_graph, clear_outputs,
                                     prepare, read_words)
from bru_kaldi.decoding.utterance import (DecodeResult, DecoderOptions, NoPathError, decode, linear_loop_graph,
                                          load_graph, transition_loglikes, with_word_penalty)

__all__ = ["decode_sets", "DecodeJob", "SetResult", "DecodeInputError", "GraphMismatchError", "MissingInputError",
           "KaldiNotFoundError", "KaldiDecodeError", "NoPathError", "DecoderOptions", "DecodeResult", "decode",
           "load_graph", "linear_loop_graph", "transition_loglikes", "with_word_penalty", "read_words", "check_graph",
           "choose_decoder", "KALDI_BINARIES", "FRAME_SHIFT"]


def decode_sets(jobs: Sequence[DecodeJob], decoding: Decoding, tune_on: Optional[str],
                log: Callable[[str], None] = print) -> dict[str, SetResult]:
    """Decode and score data sets, the setting chosen on ``tune_on`` and applied unchanged to the rest.

    Args:
        jobs: the sets (names unique); every input of every set is checked before any is decoded.
        decoding: ``[decoding]`` of the config: ``decoder`` (auto: Kaldi when all of
            :data:`KALDI_BINARIES` are on PATH), ``scoring``, beams, ``acwt``, ``acwt_sweep``, ``num_jobs``
            (0: one per CPU core). ``latbeam`` and ``max_mem`` only matter to Kaldi (no lattices here).
        tune_on: the set (with references) the setting is chosen on, or None to use ``acwt`` as it is.

    Python decoder: ``tune_on`` is decoded at every scale of ``acwt_sweep`` (``[acwt]`` when empty),
    each scale scored; the one with the fewest errors wins, ties going to the smaller scale (the
    one leaning more on the graph). Every other set is decoded at that scale only. Kaldi:
    ``decode_dnn.sh`` at ``acwt``, then ``score.sh`` over LMWT 1..10 x WIP 0.0/0.5/1.0 on ``tune_on``,
    ties going to the larger LM weight (the same rule), then the smaller penalty; untuned, LMWT is
    round(post_decode_acwt / acwt) and the penalty the smallest of ``wip_sweep``, as the Python
    decoder's. Either way, a choice on the edge of its grid grows the grid past that edge and the new
    settings are tried too (``grid.tune``, at most ``grid_extensions`` times an edge); ``res.res`` records
    the final grid on the tuning set's line (``grid=``) and any edge the choice is still on (``edge=``). Each hypothesis file of score.sh is scored again with :func:`scoring.score`, so that
    utterances Kaldi failed on count as deletions (``compute-wer --mode=present`` drops them).
    HCLG.fst is scanned against the model for the Python decoder only (Kaldi checks transition-ids
    itself, and its graphs can be too large for a scan in Python); ``graph_dir/num_pdfs`` always.

    Writes under each ``out_dir``: ``scoring/acwt_<s>.txt`` (``scoring/<lmwt>_<wip>.txt`` for Kaldi)
    and ``.per_utt`` for each setting tried, ``text`` and ``per_utt`` at the chosen one,
    ``log/decode.log``, and last ``scoring/summary.txt`` (one line per setting, the choice, the
    ``res.res`` line): a decode that crashed has no summary. Every file is written atomically.

    Returns ``{name: SetResult}`` in the order of ``jobs``. Raises :class:`MissingInputError`
    (graph, words.txt, model, scp or reference text missing), :class:`KaldiNotFoundError`,
    :class:`DecodeInputError` (log-likelihood dimension != the model's pdfs; bad ``tune_on``) and
    :class:`GraphMismatchError` (HCLG input labels beyond the model's transition-ids). Utterances
    with no surviving path are not errors: they are listed in ``SetResult.failed`` and in the log.

    >>> job = DecodeJob("dev", "exp/X/forward_dev/loglikes.scp", "exp/mono/graph", "exp/mono/final.mdl",
    ...                 "data/dev/text", "exp/X/decode_dev")
    >>> results = decode_sets([job], Decoding(acwt_sweep=[0.1, 0.2]), tune_on="dev")  # doctest: +SKIP
    >>> results["dev"].res_line()  # doctest: +SKIP
    'dev: %WER 21.30 [ 1234 / 5793, 100 ins, 300 del, 834 sub ] acwt=0.1 decoder=python rtf=0.050'
    """
    jobs = list(jobs)
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise DecodeInputError(f"decoding sets must have different names, got {names}")
    if tune_on is not None:
        if tune_on not in names:
            raise DecodeInputError(f"tune_on={tune_on!r} is not one of the sets to decode: {names}")
        if next(j for j in jobs if j.name == tune_on).ref_text is None:
            raise DecodeInputError(f"tune_on={tune_on!r} has no reference text (ref_text is None): the setting cannot "
                                   "be chosen on it (tune_on=None decodes every set at [decoding] acwt)")
    scales = list(decoding.acwt_sweep) + [decoding.acwt]
    if any(not s > 0 for s in scales):
        raise DecodeInputError(f"[decoding] acwt and acwt_sweep must be positive, got acwt={decoding.acwt} "
                               f"acwt_sweep={decoding.acwt_sweep}")
    if not jobs:
        return {}
    decoder = choose_decoder(decoding.decoder)
    try:
        prepared = [prepare(j, with_graph=decoder == "python") for j in jobs]
        for p in prepared:  # all of them before anything is decoded: a crash leaves no old result looking new
            clear_outputs(p.job.out_dir)
        results = (decode_python if decoder == "python" else decode_kaldi)(prepared, decoding, tune_on, log)
    finally:
        GRAPHS.clear()  # graphs can be large; the trainer has no further use for them
    return {name: results[name] for name in names}
