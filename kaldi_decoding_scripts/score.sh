#!/usr/bin/env bash
# Score lattices from decode_dnn.sh against a Kaldi data dir's text, for a grid of LM weights and
# word insertion penalties, as Kaldi's steps/score_kaldi.sh does: one wer_LMWT_WIP file each.
# The corpus's scoring filter (TIMIT's 48 -> 39 folding, WSJ's and AMI's noise tokens: each corpus's
# recipes/<corpus>/scoring_filter.txt, or a filter file), applied by bru_kaldi/scoring.py to references and
# hypotheses alike. Choose LMWT and WIP on dev, then score test with exactly those
# (--min-lmwt N --max-lmwt N --wip W): never choose them on test.

# Begin configuration section.
min_lmwt=1
max_lmwt=10
wip="0.0 0.5 1.0"
scoring=plain       # plain, a corpus with recipes/<corpus>/scoring_filter.txt (timit, wsj, ami), or a filter file
# End configuration section.

set -euo pipefail
echo "$0 $*"  # the command line, for the log

usage() {
  cat >&2 <<USAGE
Usage: $0 [options] <data-dir> <graph-dir> <decode-dir>
 e.g.: $0 --scoring timit data/dev exp/tri3/graph exp/TIMIT_liBRU/decode_dev
Options (defaults in brackets):
  --min-lmwt N [$min_lmwt]   --max-lmwt N [$max_lmwt]   --wip "W ..." [$wip]
  --scoring plain|timit|wsj|ami|FILTER-FILE [$scoring]
USAGE
  exit 1
}

while [ $# -gt 0 ]; do
  case "$1" in
    --min-lmwt) min_lmwt=$2; shift 2 ;;
    --max-lmwt) max_lmwt=$2; shift 2 ;;
    --wip) wip=$2; shift 2 ;;
    --scoring) scoring=$2; shift 2 ;;
    --help|-h) usage ;;
    --*) echo "$0: Error: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -eq 3 ] || usage

data=$1
graphdir=$2
dir=$3
here=$(cd "$(dirname "$0")" && pwd)

for binary in lattice-scale lattice-add-penalty lattice-best-path compute-wer; do
  command -v "$binary" >/dev/null 2>&1 || {
    echo "$0: Error: Kaldi binary $binary not found on PATH (source Kaldi's path.sh)" >&2
    exit 1
  }
done
for f in "$data/text" "$graphdir/words.txt" "$dir/num_jobs"; do
  [ -f "$f" ] || { echo "$0: Error: no such file $f" >&2; exit 1; }
done
num_jobs=$(cat "$dir/num_jobs")
for job in $(seq "$num_jobs"); do
  [ -f "$dir/lat.$job.gz" ] || { echo "$0: Error: no such file $dir/lat.$job.gz" >&2; exit 1; }
done

# the filter is applied by the toolkit (bru_kaldi/scoring.py), found from the folder above this script, run by
# the interpreter that runs run_exp.py ($PYTHON, which run_exp.py sets): a bare `python` on PATH may be
# another environment's, without kaldialign
filter() { PYTHONPATH="$here/..${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -m bru_kaldi.scoring filter "$scoring"; }

mkdir -p "$dir/scoring/log"
filter < "$data/text" > "$dir/scoring/ref.txt"
for lmwt in $(seq "$min_lmwt" "$max_lmwt"); do
  for penalty in $wip; do
    log="$dir/scoring/log/score.${lmwt}_${penalty}.log"
    {
      lattice-scale --inv-acoustic-scale="$lmwt" "ark:gunzip -c $dir/lat.*.gz |" ark:- |
        lattice-add-penalty --word-ins-penalty="$penalty" ark:- ark:- |
        lattice-best-path --word-symbol-table="$graphdir/words.txt" ark:- ark,t:- |
        awk 'NR == FNR { word[$2] = $1; next } { printf "%s", $1; for (i = 2; i <= NF; i++) printf " %s", word[$i]; print "" }' \
          "$graphdir/words.txt" - |
        filter > "$dir/scoring/${lmwt}_${penalty}.txt"
      compute-wer --text --mode=present "ark:$dir/scoring/ref.txt" "ark,p:$dir/scoring/${lmwt}_${penalty}.txt" \
        > "$dir/wer_${lmwt}_${penalty}"
    } 2> "$log" || { echo "$0: Error: scoring LMWT=$lmwt WIP=$penalty failed, log is in $log" >&2; exit 1; }
  done
done
grep -H '%WER' "$dir"/wer_* | sort -t' ' -k2,2n | awk 'NR == 1'  # awk reads all: head would end the pipe early (SIGPIPE under pipefail)
