#!/usr/bin/env bash
# The built-in corpus: a TIMIT-like Kaldi experiment made without Kaldi (see README.md beside this).
#
#   0 prepare_text   speakers (espeak-ng voices) and sentences (wonderwords word lists)
#   1 synthesize     espeak-ng speech, 16 kHz, channel/reverb/noise; wav.scp text utt2spk spk2utt
#   2 make_features  40-dim fbank (feats.scp) and 13-dim MFCC (feats_mfcc.scp), per-speaker CMVN
# --task phones (TIMIT-like, the default):
#   3 prepare_lang   data/lang (phones.txt words.txt topo L.fst) and a phone bigram G.fst
#   4 make_mono      exp/mono/{final.mdl,tree}, exp/mono_ali_{train,dev,test}/ali.N.gz
#   5 make_graph     exp/mono/graph/HCLG.fst (as utils/mkgraph.sh)
#   6 check          every table reads back, alignments fit the features, oracle decode PER < 1 %
#   7 make_graph_chain  exp/mono/graph_chain/HCLG.fst, self-loop scale 1.0: the 3-state model's graph for LF-MMI
#   8 make_chain     exp/chain: Kaldi's chain topology (data/lang_chain), its model, alignments exp/chain_ali_*
#                    and graph exp/chain/graph (scale 1.0): what LF-MMI with frame subsampling trains on
# --task words (WSJ-like, on the same audio and features):
#   3 prepare_lang_words  data/{train,dev,test}_words, lexicon, data/lang_words, trigram LMs tg and tgpr,
#                         data/lang_words_test_{tg,tgpr}/G.fst
#   4 make_mono_words     exp/mono_words/{final.mdl,tree}, exp/mono_words_ali_{train,dev,test}/ali.N.gz
#   5 make_graph_words    exp/mono_words/graph_{tg,tgpr}/HCLG.fst
#   6 check_words         every table reads back, alignments spell the words, oracle decode WER < 2 %
#   7 make_graph_chain_words  exp/mono_words/graph_chain_{tg,tgpr}/HCLG.fst, for LF-MMI on the 3-state model
#   8 make_chain_words    exp/chain_words: the chain topology's model, alignments, graphs graph_{tg,tgpr}
#
# A stage whose outputs are complete is skipped; running a stage again invalidates the later ones
# (a shared stage 0-2: those of both tasks).

# Begin configuration section.
stage=0
stop_stage=8
size=default    # default: ~1 hour of training speech; tiny: for tests
seed=1
task=phones     # phones: phone recognition (TIMIT-like); words: word recognition (WSJ-like)
replace=false   # true: a <root> built with another size, seed or layout is cleared and built anew
# End configuration section.

set -euo pipefail
echo "$0 $*"  # the command line, for the log

usage() {
  cat >&2 <<USAGE
Usage: $0 [options] [<root>]
 e.g.: $0 --size tiny --stage 0 --stop-stage 8 /tmp/mini_timit
       $0 --task words --size tiny /tmp/mini_timit
<root> holds data/ and exp/ (default: the folder of this script); both tasks can live in it.
Options (defaults in brackets):
  --task T         [$task]  phones or words (stages 0-2 are shared, 3-6 are the task's)
  --stage N        [$stage]     first stage to run (0-8)
  --stop-stage N   [$stop_stage]     last stage to run (0-8)
  --size S         [$size]  default or tiny
  --seed N         [$seed]     seed of every random choice
  --replace B      [$replace]  true: clear a <root> built with another size, seed or layout (its data/ and
                   exp/, all generated here) and build this one; false: stop, saying so
USAGE
  exit 1
}

# shellcheck disable=SC1091  # --stage N sets stage, and so on
. "$(dirname "$0")/local/parse_options.sh"
[ $# -le 1 ] || usage
case "$stage$stop_stage" in *[!0-9]*|'') echo "$0: Error: --stage and --stop-stage take integers" >&2; usage ;; esac
case "$seed" in *[!0-9]*|'') echo "$0: Error: --seed takes a non-negative integer" >&2; usage ;; esac
case "$size" in default|tiny) ;; *) echo "$0: Error: --size is default or tiny, not $size" >&2; usage ;; esac
case "$replace" in true|false) ;; *) echo "$0: Error: --replace is true or false, not $replace" >&2; usage ;; esac
case "$task" in
  phones) stages=(prepare_text synthesize make_features prepare_lang make_mono make_graph check make_graph_chain
          make_chain) ;;
  words) stages=(prepare_text synthesize make_features prepare_lang_words make_mono_words make_graph_words check_words
          make_graph_chain_words make_chain_words) ;;
  *) echo "$0: Error: --task is phones or words, not $task" >&2; usage ;;
esac

recipe_dir=$(cd "$(dirname "$0")" && pwd)
repo_root=$(cd "$recipe_dir/../.." && pwd)
root=${1:-$recipe_dir}
mkdir -p "$root"
root=$(cd "$root" && pwd)
python=${PYTHON:-python3}
command -v "$python" >/dev/null 2>&1 || { echo "$0: Error: $python not found (set PYTHON)" >&2; exit 1; }

log() {
  echo "$(date '+%Y-%m-%d %H:%M:%S') ($(basename "$0"):${BASH_LINENO[0]}) $*"
}

# Complete stages are skipped here, quietly, without starting their modules (each stage module would
# also skip itself); a corpus built with another size, seed or layout stops the recipe with the reason,
# or with --replace true is removed first.
first_incomplete() {
  (cd "$repo_root" && PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}" \
    "$python" -m recipes.mini_timit.local.layout --task "$task" --size "$size" --seed "$seed" "$root")
}
if ! first=$(first_incomplete 2>&1); then
  [ "$replace" = true ] || { echo "$first" >&2; exit 1; }
  log "$first"
  log "--replace true: removing $root/data and $root/exp to build size $size, seed $seed there instead"
  rm -rf "$root/data" "$root/exp"
  first=$(first_incomplete)
fi
if [ "$first" -gt "$stage" ]; then
  if [ "$first" -gt "$stop_stage" ]; then
    log "Stages $stage-$stop_stage are complete in $root (task $task, size $size, seed $seed): nothing to do"
  else
    log "Stages $stage-$((first - 1)) are complete in $root: starting at stage $first"
  fi
  stage=$first
fi

# Each stage is a Python module run from the repository root (it imports the bru_kaldi package from
# there); it exits non-zero on any error, which set -e turns into ours.
run_stage() {
  local n=$1 name=$2 start end
  if [ "$stage" -le "$n" ] && [ "$stop_stage" -ge "$n" ]; then
    log "Stage $n: $name"
    start=$(date +%s.%N)
    (cd "$repo_root" && PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}" \
      "$python" -m "recipes.mini_timit.local.$name" --size "$size" --seed "$seed" "$root")
    end=$(date +%s.%N)
    log "Stage $n: $name took $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"
  fi
}

for n in "${!stages[@]}"; do
  run_stage "$n" "${stages[$n]}"
done
if [ "$stop_stage" -ge 6 ]; then
  case "$task" in
    phones) log "Done: $root (oracle PER in $root/exp/mono/decode_oracle_test/per.txt)" ;;
    words) log "Done: $root (oracle WER in $root/exp/mono_words/decode_oracle_test/wer.txt)" ;;
  esac
fi
