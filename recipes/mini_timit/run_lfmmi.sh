#!/usr/bin/env bash
# LF-MMI against cross-entropy on the built-in corpus, as RESULTS.md reports it: Li-BRU, Li-GRU and LSTM
# (2 x 256, one way), each trained with frame cross-entropy (cfg/MINI{,W}_<unit>.cfg) and as a Kaldi chain
# model (cfg/MINI{,W}_<unit>_lfmmi.cfg), at seeds 1-5, on the word task and the phone task; then, on the word
# task's Li-GRU, the ablation of the LF-MMI fixes at seeds 1-3 (cfg/lfmmi_ablation/: the first version, that
# version with one fix each, and the whole recipe without Kaldi's schedule) and the recipe's two choices at
# seeds 1-2 (the denominator's phone LM order, 1 to 4; frame subsampling by splicing frames instead of taking
# every third output); then the tables.
#
#   recipes/mini_timit/run_lfmmi.sh                  # everything not yet finished
#   recipes/mini_timit/run_lfmmi.sh --stage 4        # only the tables, from the archived runs
#
# Every config keeps its own 8-epoch budget and schedule: the cross-entropy ones halve their rate on the dev
# frame error, the chain ones on the dev LF-MMI objective (Kaldi's chain recipes follow the objective).
#
# Stages (a killed stage resumes where it stopped: compare.py skips finished runs and run_exp.py resumes an
# unfinished one from its last checkpoint; each stage first copies into <out> the archived runs it lacks):
#   1 words     compare.py sweep of the word task's six configs at seeds 1-5 -> <out>/words/<config>/seed<N>
#   2 phones    the same for the phone task -> <out>/phones/...
#   3 ablation  the word task's Li-GRU: cfg/lfmmi_ablation/*.cfg at seeds 1-3 -> <out>/ablation/...; and
#               cfg/MINIW_liGRU_lfmmi.cfg at seeds 1-2 with lfmmi_phone_lm_order = 1, 3, 4 and with
#               frame_subsampling = splice -> <out>/choices/{order1,order3,order4,splice}/...
#   4 tables    compare.py archive of the finished runs (no weights) into <archive> (committed); compare.py
#               table of each task with the pairs LF-MMI : cross-entropy into RESULTS.md's generated sections
#               lfmmi-words and lfmmi-phones; of the ablation (with the full recipe's and cross-entropy's seeds
#               1-3 from stage 1, kept in <archive>/ablation/baselines as they were decoded when the ablation
#               ran) into lfmmi-ablation; of the choices (with the recipe's seeds 1-2, kept in
#               <archive>/choices/recipe) into lfmmi-choices

# Begin configuration section.
stage=1
stop_stage=4
seeds=1-5
ablation_seeds=1-3  # (single digits: the tables take the word task's runs of these seeds as seed[1-3])
choice_seeds=1-2
jobs=2              # runs at a time, each with cores / jobs threads
out=exp/lfmmi
archive=results/study_runs/lfmmi  # the finished runs without weights (stage 4), committed
# End configuration section.

set -euo pipefail

usage() {
  cat >&2 <<USAGE
Usage: $0 [options]
 e.g.: $0 --stage 4
Options (defaults in brackets):
  --stage N [$stage]  --stop-stage N [$stop_stage]   first and last stage to run (1-4)
  --seeds LIST [$seeds]   --ablation-seeds LIST [$ablation_seeds]   --choice-seeds LIST [$choice_seeds]
  --jobs N [$jobs]
  --out DIR [$out]   --archive DIR [$archive]
USAGE
  exit 1
}

# shellcheck disable=SC1091  # --stop-stage N sets stop_stage, and so on
. "$(dirname "$0")/local/parse_options.sh"
[ $# -eq 0 ] || usage
for n in "$stage" "$stop_stage" "$jobs"; do
  case "$n" in ''|*[!0-9]*) echo "$0: Error: --stage, --stop-stage and --jobs take integers, got '$n'" >&2; usage ;; esac
done

cd "$(dirname "$0")/../.."  # the repository: compare.py, cfg/ and RESULTS.md are read from there

sweep() {  # sweep PART SEEDS CONFIG... [--section,option=value ...]
  local part=$1 seeds=$2
  shift 2
  recipes/mini_timit/local/restore_runs.sh "$archive" "$out" "$part" "$@"  # runs archived before: skipped
  python compare.py sweep "$@" --seeds "$seeds" --jobs "$jobs" --out "$out/$part"
}
choices=(order1 order3 order4 splice)
override() {  # the option each choice changes
  case $1 in order*) echo "--model,lfmmi_phone_lm_order=${1#order}" ;; splice) echo "--model,frame_subsampling=splice" ;; esac
}

units=(liBRU liGRU LSTM)
words=() phones=() pairs_words=() pairs_phones=()
for unit in "${units[@]}"; do
  words+=("cfg/MINIW_$unit.cfg" "cfg/MINIW_${unit}_lfmmi.cfg")
  phones+=("cfg/MINI_$unit.cfg" "cfg/MINI_${unit}_lfmmi.cfg")
  pairs_words+=("MINIW_${unit}_lfmmi:MINIW_$unit")
  pairs_phones+=("MINI_${unit}_lfmmi:MINI_$unit")
done
ablation=(cfg/lfmmi_ablation/MINIW_liGRU_lfmmi_{first,weights,initial,chain,schedule,without_schedule}.cfg)
join() { local IFS=,; echo "$*"; }

if [ "$stage" -le 1 ] && [ "$stop_stage" -ge 1 ]; then
  echo "$(date '+%F %T') Stage 1: words"
  sweep words "$seeds" "${words[@]}"
fi

if [ "$stage" -le 2 ] && [ "$stop_stage" -ge 2 ]; then
  echo "$(date '+%F %T') Stage 2: phones"
  sweep phones "$seeds" "${phones[@]}"
fi

if [ "$stage" -le 3 ] && [ "$stop_stage" -ge 3 ]; then
  echo "$(date '+%F %T') Stage 3: ablation and the recipe's choices"
  sweep ablation "$ablation_seeds" "${ablation[@]}"
  for choice in "${choices[@]}"; do
    sweep "choices/$choice" "$choice_seeds" cfg/MINIW_liGRU_lfmmi.cfg "$(override "$choice")"
  done
fi

# keep_baselines PART SEEDS CONFIG...: the ablation and the choices are read beside the recipe's (and
# cross-entropy's) word runs of their seeds as they were decoded then: copies of <archive>/words's runs kept in
# <archive>/PART, made the first time (before this stage archives new word runs), never replaced after
keep_baselines() {
  local part=$1 seeds=$2 name run
  shift 2
  [ -d "$archive/$part" ] && return 0
  for name in "$@"; do
    for run in "$archive/words/$name"/seed[$seeds]; do
      [ -d "$run" ] || continue
      mkdir -p "$archive/$part/$name" && cp -R "$run" "$archive/$part/$name/"
    done
  done
}

if [ "$stage" -le 4 ] && [ "$stop_stage" -ge 4 ]; then
  echo "$(date '+%F %T') Stage 4: tables"
  keep_baselines ablation/baselines "$ablation_seeds" MINIW_liGRU MINIW_liGRU_lfmmi
  keep_baselines choices/recipe "$choice_seeds" MINIW_liGRU_lfmmi
  for part in words phones ablation "${choices[@]/#/choices/}"; do
    if [ -d "$out/$part" ]; then python compare.py archive "$out/$part" "$archive/$part"; fi
  done
  python compare.py table "$archive/words" --baseline MINIW_liGRU --pairs "$(join "${pairs_words[@]}")" \
    --markdown RESULTS.md --section lfmmi-words
  python compare.py table "$archive/phones" --baseline MINI_liGRU --pairs "$(join "${pairs_phones[@]}")" \
    --markdown RESULTS.md --section lfmmi-phones
  # each fix alone against the first version; the whole recipe against the first version, against itself
  # without the schedule, and against cross-entropy at the same seeds
  first=MINIW_liGRU_lfmmi_first
  python compare.py table "$archive/ablation" --baseline $first \
    --pairs "$(join MINIW_liGRU_lfmmi_{weights,initial,chain,schedule}:$first MINIW_liGRU_lfmmi:$first MINIW_liGRU_lfmmi:MINIW_liGRU_lfmmi_without_schedule MINIW_liGRU_lfmmi:MINIW_liGRU $first:MINIW_liGRU)" \
    --markdown RESULTS.md --section lfmmi-ablation
  python compare.py table "$archive/choices/recipe" "${choices[@]/#/$archive/choices/}" \
    --baseline MINIW_liGRU_lfmmi --markdown RESULTS.md --section lfmmi-choices
fi
