#!/usr/bin/env bash
# Decode log-likelihood archives written by run_exp.py with Kaldi's latgen-faster-mapped,
# one job per archive in parallel, lattices gzipped per job (decode-dir/lat.N.gz).
#
# The log-likelihoods are already log posteriors minus log priors: no further normalisation here.

# Begin configuration section.
min_active=200
max_active=7000
max_mem=50000000
beam=13.0
latbeam=8.0
acwt=0.2
post_decode_acwt=1.0  # the lattices' acoustic scores times this (Kaldi decodes chain models with 10)
max_jobs=0          # jobs running at once; 0: one per CPU core
# End configuration section.

set -euo pipefail
echo "$0 $*"  # the command line, for the log

usage() {
  cat >&2 <<USAGE
Usage: $0 [options] <graph-dir> <model> <decode-dir> <loglik-ark-or-scp> [<loglik-ark-or-scp> ...]
 e.g.: $0 --beam 13.0 --acwt 0.2 recipes/mini_timit/exp/mono/graph exp/MINI_liBRU/final.mdl \\
          exp/MINI_liBRU/decode_test exp/MINI_liBRU/forward_test/loglikes.scp
Reads <graph-dir>/HCLG.fst and words.txt, <model> (its TransitionModel) and each log-likelihood archive
(one decoding job each, run_exp.py writes forward_<set>/loglikes.scp); writes <decode-dir>/lat.N.gz,
<decode-dir>/num_jobs and <decode-dir>/log/decode.N.log.
Options (defaults in brackets):
  --min-active N   [$min_active]     --max-active N   [$max_active]
  --max-mem N      [$max_mem]        --beam F         [$beam]
  --latbeam F      [$latbeam]        --acwt F         [$acwt]
  --post-decode-acwt F [$post_decode_acwt] (chain models: 10, so that score.sh's LM weights reach scales near 1)
  --max-jobs N     [$max_jobs] (0: one per CPU core)
USAGE
  exit 1
}

while [ $# -gt 0 ]; do
  case "$1" in
    --min-active) min_active=$2; shift 2 ;;
    --max-active) max_active=$2; shift 2 ;;
    --max-mem) max_mem=$2; shift 2 ;;
    --beam) beam=$2; shift 2 ;;
    --latbeam) latbeam=$2; shift 2 ;;
    --acwt) acwt=$2; shift 2 ;;
    --post-decode-acwt) post_decode_acwt=$2; shift 2 ;;
    --max-jobs) max_jobs=$2; shift 2 ;;
    --help|-h) usage ;;
    --*) echo "$0: Error: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -ge 4 ] || usage

graphdir=$1
model=$2
dir=$3
shift 3
archives=("$@")

command -v latgen-faster-mapped >/dev/null 2>&1 || {
  echo "$0: Error: Kaldi binary latgen-faster-mapped not found on PATH (source Kaldi's path.sh, or set [decoding] decoder = python)" >&2
  exit 1
}
for f in "$graphdir/HCLG.fst" "$graphdir/words.txt" "$model" "${archives[@]}"; do
  [ -f "$f" ] || { echo "$0: Error: no such file $f" >&2; exit 1; }
done

[ "$max_jobs" -gt 0 ] || max_jobs=$(nproc)
mkdir -p "$dir/log"
scale=""
if [ "$post_decode_acwt" != "1.0" ] && [ "$post_decode_acwt" != "1" ]; then
  scale="lattice-scale --acoustic-scale=$post_decode_acwt ark:- ark:- | "
fi

# Each archive is one job; a job's failure fails the script and names its log.
pids=()
logs=()
job=0
for archive in "${archives[@]}"; do
  job=$((job + 1))
  case "$archive" in *.scp) rspecifier="scp:$archive" ;; *) rspecifier="ark:$archive" ;; esac
  log="$dir/log/decode.$job.log"
  (
    latgen-faster-mapped --min-active="$min_active" --max-active="$max_active" --max-mem="$max_mem" \
      --beam="$beam" --lattice-beam="$latbeam" --acoustic-scale="$acwt" --allow-partial=true \
      --word-symbol-table="$graphdir/words.txt" "$model" "$graphdir/HCLG.fst" "$rspecifier" \
      "ark:|${scale}gzip -c > $dir/lat.$job.gz.tmp" && mv "$dir/lat.$job.gz.tmp" "$dir/lat.$job.gz"
  ) >"$log" 2>&1 &
  pids+=($!)
  logs+=("$log")
  # keep at most max_jobs running
  while [ "$(jobs -rp | wc -l)" -ge "$max_jobs" ]; do sleep 0.2; done
done

failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "$0: Error: decoding job $((i + 1)) failed, log is in ${logs[$i]}" >&2
    failed=$((failed + 1))
  fi
done
if [ "$failed" -gt 0 ]; then
  echo "$0: $failed / ${#pids[@]} decoding jobs failed" >&2
  exit 1
fi
echo "$job" > "$dir/num_jobs"
echo "$0: decoded ${#archives[@]} archive(s) into $dir"
