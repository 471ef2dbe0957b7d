#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU, most important first, each under its own time limit:
#   1 the fast paths against the reference loops on the GPU, float32 (tests/test_fast_recurrences.py,
#     backends cuda = the Triton kernels and cuda-torchscript = their fallback)
#   2 bench/recurrences.py --targets on the GPU: every unit against cuDNN's LSTM, and the whole training step,
#     written into RESULTS.md's speed-cuda section (OUT_DIR/RESULTS.md: copy it over the checkout's)
#   3 the built-in corpus, then the main job (cfg/MINI_liBRU.cfg) on the GPU, timed
#   4 bench/triton_blocks.py: the kernels' block sizes (what the launcher's defaults rest on)
#   5 the rest of the fast-path tests on the GPU (float64, gradcheck, memory; pytest-xdist if installed)
#   6 LF-MMI's forward-backward on GPU outputs, both paths (the C++ op on the host, the torch loop on the
#     GPU), against the brute force (tests/test_chain.py -k cuda)
#   7 bench/lfmmi.py --device cuda: the objective's share of a training step, each path (the corpus first)
#
#   bench/cuda_check.sh OUT_DIR        # a log per step in OUT_DIR; a summary on stdout
# The steps' limits add up to about 10 minutes; STEPS="1 2" runs only those.
set -uo pipefail

out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit
python=$(command -v python3 || command -v python)
steps=${STEPS:-1 2 3 4 5 6 7}

step() {  # step NUMBER NAME SECONDS COMMAND...: the command's output into OUT_DIR/NAME.log, its tail here
  local number=$1 name=$2 limit=$3
  shift 3
  [[ " $steps " == *" $number "* ]] || return 0
  echo "== $name ($(date +%T), at most ${limit} s): $*"
  local start=$SECONDS
  timeout -s INT -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  echo "== $name: exit code $?, $((SECONDS - start)) s"
  tail -n "${TAIL:-20}" "$out/$name.log"
}

{ nvidia-smi -L
  "$python" -c "import torch, triton; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(), 'triton', triton.__version__)"
  nproc; } 2>&1
xdist=$("$python" -c "import xdist" 2>/dev/null && echo "-n 8")
# shellcheck disable=SC2086  # $xdist is empty or two words
TAIL=8 step 1 fast_paths_f32 120 "$python" -m pytest -q -p no:cacheprovider $xdist tests/test_fast_recurrences.py \
  -k "equals_reference and f32 and cuda"
# the table goes into RESULTS.md's speed-cuda section there; that RESULTS.md comes back in OUT_DIR
TAIL=40 step 2 bench 120 "$python" bench/recurrences.py --targets --repeats 5 --device cuda \
  --markdown RESULTS.md --section speed-cuda
cp RESULTS.md "$out/RESULTS.md"
main_job() {
  "$python" -c "from recipes.mini_timit.corpus import ensure_corpus; ensure_corpus(log=lambda line: None)" || return
  local start=$SECONDS
  "$python" run_exp.py cfg/MINI_liBRU.cfg --exp,out_folder=exp/cuda_check/MINI_liBRU || return
  echo "main job, the corpus built: $((SECONDS - start)) s"
  grep -h "epoch=\|PER\|WER" exp/cuda_check/MINI_liBRU/log.txt | tail -n 12
}
export python
export -f main_job
TAIL=16 step 3 main_job 120 bash -c main_job
TAIL=30 step 4 blocks 45 "$python" bench/triton_blocks.py --units libru lstm --block-h 8 16 --block-k 32 64 \
  --warps 2 4
# shellcheck disable=SC2086
TAIL=12 step 5 fast_paths 90 "$python" -m pytest -q -p no:cacheprovider $xdist tests/test_fast_recurrences.py \
  -k "cuda and not (equals_reference and f32)"
# shellcheck disable=SC2086
TAIL=6 step 6 chain 90 "$python" -m pytest -q -p no:cacheprovider $xdist tests/test_chain.py -k cuda
lfmmi_bench() {
  "$python" -c "from recipes.mini_timit.corpus import ensure_corpus; ensure_corpus(log=lambda line: None)" || return
  "$python" bench/lfmmi.py --device cuda --repeats 5
}
export -f lfmmi_bench
TAIL=8 step 7 lfmmi_bench 90 bash -c lfmmi_bench
