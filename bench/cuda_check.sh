#!/usr/bin/env bash
# The CUDA checks, for a machine with a GPU, most important first, each under its own time limit:
#   1 the fast-path tests with the layers and tensors on the GPU (tests/test_fast_recurrences.py, backend cuda)
#   2 bench/recurrences.py --targets on the GPU: every unit against cuDNN's LSTM, and the whole training step
#   3 one epoch of cfg/MINI_liGRU.cfg and cfg/MINI_LSTM.cfg, then the main job (cfg/MINI_liBRU.cfg), timed
#   4 the whole test suite (pytest-xdist if it is installed): the tests that run shipped configs ([exp]
#     device = auto) train on the GPU, those on the tiny test config (device = cpu) on the CPU
#
#   bench/cuda_check.sh OUT_DIR        # a log per step in OUT_DIR; a summary on stdout
set -uo pipefail

out=${1:?usage: $0 OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit
python=$(command -v python3 || command -v python)

step() {  # step NAME SECONDS COMMAND...: the command's output into OUT_DIR/NAME.log, its tail here
  local name=$1 limit=$2
  shift 2
  echo "== $name ($(date +%T), at most ${limit} s): $*"
  local start=$SECONDS
  timeout -s INT -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  echo "== $name: exit code $?, $((SECONDS - start)) s"
  tail -n "${TAIL:-20}" "$out/$name.log"
}

{ nvidia-smi -L; "$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"; nproc; } 2>&1
step fast_paths 100 "$python" -m pytest -q -p no:cacheprovider tests/test_fast_recurrences.py -k cuda
TAIL=45 step bench 130 "$python" bench/recurrences.py --targets --repeats 2 --device cuda
mini() {
  for cfg in MINI_liGRU MINI_LSTM; do
    "$python" run_exp.py cfg/$cfg.cfg --exp,n_epochs_tr=1 --stop-stage train --exp,out_folder=exp/cuda_check/$cfg || return
    grep -h "epoch=001\|model:" exp/cuda_check/$cfg/log.txt
  done
  local start=$SECONDS
  "$python" run_exp.py cfg/MINI_liBRU.cfg --exp,out_folder=exp/cuda_check/MINI_liBRU || return
  echo "main job: $((SECONDS - start)) s"
  grep -h "epoch=\|PER\|WER" exp/cuda_check/MINI_liBRU/log.txt | tail -n 12
}
export python
export -f mini
TAIL=30 step mini 180 bash -c mini
xdist=$("$python" -c "import xdist" 2>/dev/null && echo "-n $(nproc)")
# shellcheck disable=SC2086  # $xdist is empty or two words
step suite "${SUITE_SECONDS:-150}" "$python" -m pytest -q -p no:cacheprovider $xdist
