#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU, most important first, each under its own time limit (the limits
# add up to about 8.5 minutes on an H200; a run takes less):
#   1 self_test    every kernel family's self-test at its production size (T=300 B=16 H=550, both directions)
#                  against its TorchScript loop, float32: the log auto mode writes (python -m models.fast.self_test)
#   2 stress       H=550, T=1000, B=32, both directions, 100 forward + backward passes of each unit with a
#                  barrier kernel (and the UBRU's scans), every pass finite and equal to the first (bench/stress.py)
#   3 beside       the Li-BRU's stress beside a second process stressing the LSTM on the same GPU, at once
#   4 fast_paths   the fast paths against the reference loops on the GPU at hidden sizes that need several
#                  programs (H=45: 6 programs of 8 units), float32 and float64, training and no-grad
#   5 bench        bench/recurrences.py --targets: every unit against cuDNN's LSTM and the whole training step,
#                  written into RESULTS.md's speed-cuda section (OUT_DIR/RESULTS.md: copy it over the checkout's)
#   6 chain        LF-MMI's forward-backward on the GPU, every path (the Triton kernel, the C++ op on the host,
#                  the torch loop) against the brute force and the C++ op (tests/test_chain*.py -k cuda)
#   7 corpus       the built-in corpus (for 8 and 9)
#   8 lfmmi_bench  bench/lfmmi.py --device cuda: the objective's share of a training step, each path
#   9 main_job     cfg/MINI_liBRU.cfg on the GPU, timed
#
#   bench/cuda_check.sh OUT_DIR        # a log per step in OUT_DIR, a summary on stdout; exit 1 if a step failed
#   STEPS="1 2" bench/cuda_check.sh OUT_DIR                # only those steps
#   SMOKE=1 STEPS="1 2 3 4 6" bench/cuda_check.sh OUT_DIR  # on the CPU: each step's CPU mode (the interpreter,
#       tiny sizes; the pytest steps collect their GPU tests and skip them), so that a typo here costs no GPU time
set -uo pipefail

out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit
python=$(command -v python3 || command -v python)
steps=${STEPS:-1 2 3 4 5 6 7 8 9}
smoke=${SMOKE:-0}
failed=()

step() {  # step NUMBER NAME SECONDS COMMAND...: the command's output into OUT_DIR/NAME.log, its tail here
  local number=$1 name=$2 limit=$3
  shift 3
  [[ " $steps " == *" $number "* ]] || return 0
  [[ $smoke == 1 ]] && limit=$((limit * 5))  # (the CPU modes: the interpreter, on a CPU maybe shared)
  echo "== $name ($(date +%T), at most ${limit} s): $*"
  local start=$SECONDS code
  timeout -s INT -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  code=$?
  # (SMOKE: pytest selecting nothing, 5, is a pass: the fast paths' GPU backends exist only where there is one)
  [[ $smoke == 1 && $code == 5 && " $* " == *" pytest "* ]] && code=0
  echo "== $name: exit code $code, $((SECONDS - start)) s"
  tail -n "${TAIL:-20}" "$out/$name.log"
  [[ $code == 0 ]] || failed+=("$name")
}

xdist=(-n 0)
"$python" -c "import xdist" 2>/dev/null && xdist=(-n 8)
if [[ $smoke == 1 ]]; then
  xdist=(-n 0)
  self_test=(--smoke --families gated_forward:libru scans)
  stress=(--smoke)
  beside=(--smoke)
  bench=(--smoke)
  lfmmi=(--smoke)
else
  { nvidia-smi -L
    "$python" -c "import torch, triton; print('torch', torch.__version__, 'CUDA', torch.version.cuda, \
torch.cuda.get_device_name(), 'triton', triton.__version__)"
    nproc; } 2>&1
  self_test=(--dtypes float32)
  stress=(--units libru lstm gru mgu lbru:layer ubru:hmm)
  beside=(--passes 100)
  bench=(--targets --repeats 3 --device cuda --markdown RESULTS.md --section speed-cuda)
  lfmmi=(--device cuda --repeats 5)
fi

TAIL=18 step 1 self_test 60 "$python" -m models.fast.self_test "${self_test[@]}"
TAIL=8 step 2 stress 75 "$python" bench/stress.py "${stress[@]}"
beside() {  # two processes on one GPU at once, each its own grids beside the other's
  "$python" bench/stress.py "$@" --units lstm > "$out/beside_lstm.log" 2>&1 &
  local other=$!
  "$python" bench/stress.py "$@" --units libru
  local code=$?
  wait "$other" || code=1
  echo "== the second process (the LSTM's stress):"
  cat "$out/beside_lstm.log"
  return "$code"
}
export python out
export -f beside
TAIL=10 step 3 beside 60 bash -c 'beside "$@"' beside "${beside[@]}"
TAIL=8 step 4 fast_paths 60 "$python" -m pytest -q -p no:cacheprovider "${xdist[@]}" tests/test_fast_recurrences.py \
  -k "cuda and not torchscript and (split_units or panels or no_grad or (equals_reference and f32))"
# the table goes into RESULTS.md's speed-cuda section there; that RESULTS.md comes back in OUT_DIR
TAIL=40 step 5 bench 80 "$python" bench/recurrences.py "${bench[@]}"
[[ $smoke == 1 ]] || cp RESULTS.md "$out/RESULTS.md"
TAIL=6 step 6 chain 45 "$python" -m pytest -q -p no:cacheprovider "${xdist[@]}" tests/test_chain.py \
  tests/test_chain_triton.py -k cuda
TAIL=4 step 7 corpus 90 "$python" -c \
  "from recipes.mini_timit.corpus import ensure_corpus; ensure_corpus(log=print)"
TAIL=8 step 8 lfmmi_bench 45 "$python" bench/lfmmi.py "${lfmmi[@]}"
main_job() {
  local start=$SECONDS
  "$python" run_exp.py cfg/MINI_liBRU.cfg --exp,out_folder=exp/cuda_check/MINI_liBRU || return
  echo "main job, the corpus built: $((SECONDS - start)) s"
  grep -h "epoch=\|PER\|WER\|self-test" exp/cuda_check/MINI_liBRU/log.txt | tail -n 16
}
export -f main_job
[[ $smoke == 1 ]] && steps=${steps//9/}  # (no CPU mode: the main job takes minutes on a CPU)
TAIL=16 step 9 main_job 70 bash -c main_job

echo "cuda_check: ${#failed[@]} step(s) failed${failed[*]:+: ${failed[*]}}"
[[ ${#failed[@]} == 0 ]]
