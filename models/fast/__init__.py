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
                    pass, programs splitting the units, a barrier a step) in place of the loops,
                    so that they cannot hang (cooperative launches, grids from occupancy, a barrier
                    that gives up and a rerun on the loop)
``self_test``       the kernels' self-test before ``auto`` mode trusts them on a device and dtype
``budgets``         the kernels compiled for an H100/H200 without one: registers, spills, occupancy
==================  =========================================================================

Three backends run the loops: the C++ kernels on the CPU, the Triton kernels on a GPU, and
TorchScript loops of a few ``out=`` kernels a step wherever neither can run. All are tested against
the reference loop of every unit (``tests/test_fast_recurrences.py``; the Triton kernels on the CPU
through Triton's interpreter in ``tests/test_triton_kernels.py``). A unit without a fast path needs
nothing here: its cell's ``fast_forward`` returns ``None`` and the reference loop runs.

The C++ kernels split the hidden units between the threads for the whole loop of a unit with a
recurrent matrix: each thread multiplies by its own columns of every gate and runs the elementwise
step of its own units, one barrier a step. The product of a few sequences by the recurrent matrix is
one a BLAS does slowly: the AVX2 build has its own (the matrix packed once per loop into panels of 24
rows, 4 sequences at a time; 1.2-1.7 times MKL's packed GEMM on these shapes); the AVX-512 build and
float64 use the BLAS libtorch uses. The gated family shares one forward and one backward driver, a
unit being a short struct of its elementwise step and that step's derivatives, picked by name (LBRU
has its own). pytorch-kaldi's inner dropout is an optional mask those steps take, forward and
backward. The UBRU's recursions are elementwise: one call each, the time loop inside. The build is
for the widest vector ISA torch uses on the CPU (AVX-512, falling back to AVX2; AVX2; generic), on
first use, into torch's extension cache (:mod:`models.fast.native`). The kernels' error messages turn
numbers into text without the C++ library's streams: a compiler whose C++ library is not the one the
process loads once crashed there.

Around the loops, the layers (:mod:`models.recurrent`) keep activations time-major, skip the padding
masks for batches without padding (and zero a padded batch's tails with a copy and one fill per
sequence), put the two directions' outputs together in one pass, and compute the probabilities only
for ``posteriors()``. A bidirectional layer whose input is at least as wide as one direction's
projections projects both directions in one product and reverses the backward direction's columns.
The projections' gradients, and the output layers', are written into rows padded to 32 bytes
(:mod:`models.fast.products`: MKL's GEMM ran about a third slower into rows of 1100 floats). Batch norm
(:mod:`models.norm`) takes its statistics over the real frames in two C++ passes each way and writes
padded frames as 0, so that a layer with it need not zero its projections' padding. On a CPU,
``run_exp.py`` flushes subnormal floats to zero while it runs (gradients decaying through hundreds of
frames reach them, and x86 CPUs handle them in microcode: a Li-GRU step's backward pass took twice as
long); a training script of your own should do the same (``torch.set_flush_denormal(True)``).
"""

from models.fast.paths import FAST, gated, lbru, ubru

__all__ = ["FAST", "gated", "lbru", "ubru"]
