"""The Triton kernels compile for a Hopper GPU (sm_90) within their budgets, on a machine without one.

Triton's interpreter (tests/test_triton_kernels.py) checks what the kernels compute, but it accepts
code that the compiler refuses: a global that is not ``tl.constexpr``, a ``tl.dot`` of a shape the
target has no instruction for, a conditional expression. Here (:mod:`models.fast.budgets`) every layer
with a fast path runs its forward and backward passes, and its forward pass under ``torch.no_grad()``
(the inference variants), with the compiled kernels at the launcher's production block sizes (32
sequences, the largest row blocks, at H = 550), in float32 and in float64, each launch only compiled for
sm_90 (Triton's bundled ``ptxas`` included), and the launcher sizes its grids from the compiled kernels'
occupancy with an H100's or H200's limits; then the LF-MMI kernel. The budgets: no kernel spills more
than ``SPILL_BOUND`` bytes a thread; every kernel with a grid barrier, and only those, is launched
cooperatively; at the grid the launcher chose, a multiprocessor holds at least twice the programs that
grid puts on it; the inference variants are compiled for every unit that has them.
"""

import pytest
import torch

pytest.importorskip("triton")  # in requirements.txt; a machine without it has no kernels to check

from triton.runtime.jit import JITFunction  # noqa: E402

from bru_kaldi.chain import triton_fb  # noqa: E402
from bru_kaldi.chain.graph import ChainGraph, denominator_graph  # noqa: E402
from models.fast import budgets, triton_loops  # noqa: E402
from tests.test_chain import arcs_of, numerator_graph, random_graph  # noqa: E402

pytestmark = pytest.mark.slow  # compiling about 50 kernels a dtype at production sizes: a minute or two on 2 cores

SPILL_BOUND = 128  # bytes a thread may spill to local memory (68 at most when first measured)
BARRIER_KERNELS = {"gated_forward", "gated_backward", "lbru_forward", "lbru_backward", "matrix_forward",
                   "matrix_backward"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_every_kernel_compiles_for_hopper_within_its_budgets(dtype):
    variants = budgets.fast_variants()
    with budgets.compile_only() as compiled:
        budgets.production_passes(variants, dtype)
        grids, variants = dict(triton_loops.GRIDS), dict(triton_loops.VARIANTS)
    kernels = {name for name, value in vars(triton_loops._load(False)).items()
               if isinstance(value, JITFunction) and not name.startswith("_")}
    assert kernels and set(compiled) == kernels, sorted(kernels - set(compiled))
    for name, found in compiled.items():
        for kernel in found:
            assert kernel.spilled <= SPILL_BOUND, (name, kernel)
            assert kernel.cooperative == (name in BARRIER_KERNELS), (name, kernel)
    assert {key[0] for key in grids} == BARRIER_KERNELS
    for key, (occupancy, programs) in grids.items():
        per_multiprocessor = -(-programs // triton_loops.HOPPER.multiprocessors)
        assert per_multiprocessor == 1 and occupancy.per_multiprocessor >= 2 * per_multiprocessor, (key, occupancy)
    # the inference variants: TRAIN off under torch.no_grad(), for every kernel and unit that has TRAIN
    trained = {(name, dict(constants).get("KIND"), dict(constants)["TRAIN"])
               for name, constants in variants if "TRAIN" in dict(constants)}
    assert {(name, kind) for name, kind, train in trained if not train} == {
        (name, kind) for name, kind, train in trained if train} != set()


def test_the_lfmmi_kernel_compiles_for_hopper_within_its_budget():
    """Both dtypes, a shared denominator (leaky) and a batch of numerators (windows)."""
    den = denominator_graph(24, arcs_of(random_graph(21, 24, 7)))
    nums = ChainGraph.batch([numerator_graph([0, 0, 1, 3, 3, 6], 1), numerator_graph([4, 4, 1], 1)])
    with budgets.compile_only() as compiled:
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(2, 6, 7, dtype=dtype)
            for graphs, leaky in [(den.expand(2), 0.1), (nums, 0.0)]:
                triton_fb._run(triton_fb._kernel(False), x, torch.tensor([6, 3]), graphs, leaky, False)
    found = compiled["_kernel_source"]
    assert len(found) == 4 and all(kernel.spilled <= SPILL_BOUND and not kernel.cooperative for kernel in found), found
