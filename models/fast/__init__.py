"""Fast paths of the recurrent units: the same functions as their reference loops, with hand-written
backward passes that save only what backward needs.

==================  =========================================================================
``paths``           per unit, the vectorised glue a cell's ``fast_forward`` calls (:func:`gated`,
                    :func:`lbru`, :func:`ubru`); ``FAST`` says which units and options are covered
``gated``           autograd Functions of the cells with a recurrent matrix: the gated family
                    (BRU, Li-BRU, Li-GRU, GRU, LSTM, MGU, RNN) and LBRU
``loops``           their TorchScript time loops (where neither kernel below can run)
``scans``           elementwise recursions (UBRU alpha, Kalman and HMM backward passes, smoothing)
``native``          builds and loads the C++ kernels of ``csrc/recurrences.cpp`` (the CPU backend)
``products``        the layers' and heads' projections, their gradients written into rows aligned
                    for the CPU's GEMM (:func:`linear`)
``csrc/``           the C++ kernels: one fused pass a time step, threads splitting the units; a unit
                    of the gated family is its elementwise step there, found by name
``triton_loops``    the GPU backend: launches the Triton kernels of ``triton_kernels.py`` (one a
                    pass, programs splitting the units, a barrier a step) in place of the loops
==================  =========================================================================

Three backends run the loops: the C++ kernels on the CPU, the Triton kernels on a GPU, and
TorchScript loops of a few ``out=`` kernels a step wherever neither can run. All are tested against
the reference loop of every unit (``tests/test_fast_recurrences.py``; the Triton kernels on the CPU
through Triton's interpreter in ``tests/test_triton_kernels.py``). A unit without a fast path needs
nothing here: its cell's ``fast_forward`` returns ``None`` and the reference loop runs.
"""

from models.fast.paths import FAST, gated, lbru, ubru

__all__ = ["FAST", "gated", "lbru", "ubru"]
