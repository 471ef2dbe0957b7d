#!/usr/bin/env bash
# The unit comparison of RESULTS.md on the built-in corpus: the configs of the BRU papers' claims on the
# phone task and the word task's Li-BRU, Li-GRU and LSTM, each at seeds 1-5 and trained until its dev
# error stops improving; then the tables, the claims' verdicts (results/claims_*.tsv) and the figures.
# Every unit trains with one optimiser and one rate: RMSprop with the bias-corrected square average at lr
# 0.002 in every architecture (opt_bias_correction = True, arch_lr = 0.002), also where a config ships with
# plain RMSprop or another rate (MINI_liGRU_UBRU ships at 0.001): a comparison of units holds everything
# else equal.
#
#   recipes/mini_timit/run_study.sh                 # everything not yet finished (about 11 h on 2 cores)
#   recipes/mini_timit/run_study.sh --stage 4       # only the tables and figures, from the runs so far
#   recipes/mini_timit/run_study.sh --stop-stage 1 --seeds 5 --jobs all   # on a GPU machine: one seed of every
#                                                   # phone config at once (13 runs, 7.4 min on an H200)
#   recipes/mini_timit/run_study.sh --stage 3 --more-seeds 6-10   # more phone seeds, then the tables
#
# The seeds: five a config, the least a run-level verdict should rest on, and what the budget (about
# 15 h on 2 cores) affords. Resolving a 1.5-point difference of PER with 80 % power would take 6-35
# seeds a config (the pairs table's column "seeds for 1.5 points", from the five seeds' variance
# components): 6-7 for the LBRU pairs, 11-17 for the Li-BRU and Li-GRU+UBRU pairs, 26-35 for the UBRU
# pairs (the seeds of the UBRU's recursions spread by more than 2 points). Two more seeds a config is
# all the budget left, and would resolve 1.5 points for no phone pair the five leave unresolved, so the
# study stops at five; --more-seeds runs stage 3 for whoever has the time (a GPU machine: 7.4 min per
# seed of all thirteen on an H200). On the word task, 1.5 points of WER would take 7 seeds (Li-BRU :
# Li-GRU, --word-seeds 1-7) and 15 (LSTM : Li-GRU). RESULTS.md, "Why five seeds", says which few more
# seeds would resolve what, and what they cost.
#
# The schedule (the budget): at most 24 epochs, as the papers' TIMIT recipes; the rate halves after an
# epoch that does not improve the dev frame error by 0.1 % (relative), as in the papers; a run stops
# after 2 epochs in a row without a new best dev frame error, and its best epoch's weights are decoded
# ([exp] patience, cfg/README.md). Everything else is each config's own.
#
# Stages (a killed stage resumes where it stopped: compare.py skips finished runs and run_exp.py
# resumes an unfinished one from its last checkpoint). Stages 1 and 2 give every config of both tasks
# its five seeds; stage 3, when asked, gives the phone configs more:
#   1 phones   compare.py sweep of the phone configs at seeds 1-5 -> <out>/phones/<config>/seed<N>
#   2 words    compare.py sweep of MINIW_liBRU, MINIW_liGRU, MINIW_LSTM at seeds 1-5 -> <out>/words/...
#   3 more     the phone configs at --more-seeds (none unless asked: the study is stages 1, 2 and 4)
#   4 tables   compare.py archive of the finished runs (no weights) into <archive> (results/study_runs/layout2,
#              committed); compare.py table of that, with the claims, into RESULTS.md's generated
#              sections study-layout2-phones and -words, the claims' table alone into README.md's
#              claims-phones and -words; figures into results/study_layout2_*
# A study can be run in parts, on several clones and machines: stages 1-2 first copy into <out> the
# archived runs it lacks (stage 3 too), so that the sweeps skip them.

# Begin configuration section.
stage=1
stop_stage=4
seeds=1-5
more_seeds=        # a third round of phone seeds for stage 3, e.g. 6-10 (none: stage 3 does nothing)
word_seeds=1-5
jobs=2              # runs at a time, each with cores / jobs threads; all: every run of a stage at once
phone_configs=      # the phone configs to sweep, space-separated (default: all of the claims' below)
out=exp/study_layout2
archive=results/study_runs/layout2  # the finished runs without weights (stage 4), committed: the study's memory
epochs=24
patience=2
lr=0.002
# End configuration section.

set -euo pipefail

usage() {
  cat >&2 <<USAGE
Usage: $0 [options]
 e.g.: $0 --stage 4
Options (defaults in brackets):
  --stage N [$stage]  --stop-stage N [$stop_stage]   first and last stage to run (1-4)
  --seeds LIST [$seeds]   --more-seeds LIST [${more_seeds:-none}]   the phone task's two rounds of seeds
  --word-seeds LIST [$word_seeds]   --jobs N [$jobs]   --out DIR [$out]
  --jobs all   every run of a stage at once, the sweeps of 1- and 2-architecture configs side by side
  (for a GPU machine)
  --phone-configs "CFG ..." [all of the claims']   a part of the phone configs, e.g. to run two parts at
  once with their own --jobs (two instances must not share a config: both would train the same runs)
  --archive DIR [$archive]   --epochs N [$epochs]   --patience N [$patience]   the schedule's budget and stopping
  rule   --lr X [$lr]   every architecture's rate
USAGE
  exit 1
}

# shellcheck disable=SC1091  # --stop-stage N sets stop_stage, and so on
. "$(dirname "$0")/local/parse_options.sh"
[ $# -eq 0 ] || usage
for n in "$stage" "$stop_stage" "${jobs/#all/1}" "$epochs" "$patience"; do
  case "$n" in ''|*[!0-9]*) echo "$0: Error: --stage, --stop-stage, --jobs (or all), --epochs and --patience take integers, got '$n'" >&2; usage ;; esac
done

cd "$(dirname "$0")/../.."  # the repository: compare.py, cfg/ and RESULTS.md are read from there (and
                            # relative --out and --archive)
schedule=("--exp,n_epochs_tr=$epochs" "--exp,patience=$patience")
kept=$archive

restore() {  # restore TASK CONFIG...: the archived runs of those configs that <out> has not finished, copied there
  recipes/mini_timit/local/restore_runs.sh "$kept" "$out" "$@"
}

# The configs of the claims (results/claims_phones.tsv), and the word task's three
phones=(cfg/MINI_liBRU.cfg cfg/MINI_liGRU.cfg cfg/MINI_liBRU_bi.cfg cfg/MINI_liGRU_bi.cfg cfg/MINI_liGRU_bi3.cfg
        cfg/MINI_UBRU.cfg cfg/MINI_UBRU_kalman.cfg cfg/MINI_UBRU_hmm.cfg cfg/MINI_UBRU_bi.cfg cfg/MINI_liGRU_UBRU.cfg
        cfg/MINI_LBRU.cfg cfg/MINI_GRU.cfg cfg/MINI_GRU_bi.cfg)
if [ -n "$phone_configs" ]; then
  read -r -a phones <<< "$phone_configs"
  for cfg in "${phones[@]}"; do
    [ -f "$cfg" ] || { echo "$0: Error: --phone-configs: no config file $cfg" >&2; exit 1; }
  done
fi
words=(cfg/MINIW_liBRU.cfg cfg/MINIW_liGRU.cfg cfg/MINIW_LSTM.cfg)

# The pairs of the claims' tables besides the claims' own (compare.py --claims adds those): the word task's LSTM.
word_pairs=MINIW_LSTM:MINIW_liGRU

count_seeds() {  # count_seeds LIST: how many seeds a list such as 1-5 or 1,3,6-10 names
  local total=0 part parts
  IFS=, read -r -a parts <<< "$1"
  for part in "${parts[@]}"; do
    case "$part" in *-*) total=$((total + ${part#*-} - ${part%-*} + 1)) ;; *) total=$((total + 1)) ;; esac
  done
  echo "$total"
}

sweep() {  # sweep SEEDS OUT CONFIG...: compare.py sweep with the study's optimiser and rate in every
  # architecture a config has (each has its own optimiser), so the configs go in one sweep per number
  # of [architectureN] sections: one after the other, or side by side with --jobs all
  local seeds=$1 to=$2 cfg n i at_once failed=0
  shift 2
  local -A by_count=()
  local pids=()
  for cfg in "$@"; do
    n=$(grep -c '^\[architecture[0-9]' "$cfg")
    by_count[$n]+="$cfg "
  done
  for n in $(printf '%s\n' "${!by_count[@]}" | sort -n); do
    local optimiser=()
    for i in $(seq 1 "$n"); do optimiser+=("--architecture$i,opt_bias_correction=True" "--architecture$i,arch_lr=$lr"); done
    # shellcheck disable=SC2086  # the configs' paths have no spaces
    if [ "$jobs" = all ]; then
      at_once=$(( $(wc -w <<< "${by_count[$n]}") * $(count_seeds "$seeds") ))
      python compare.py sweep ${by_count[$n]} --seeds "$seeds" --jobs "$at_once" --out "$to" "${schedule[@]}" \
        "${optimiser[@]}" &
      pids+=($!)
    else
      python compare.py sweep ${by_count[$n]} --seeds "$seeds" --jobs "$jobs" --out "$to" "${schedule[@]}" "${optimiser[@]}"
    fi
  done
  # a stop stops the sweeps run side by side too (each stops its runs, which resume the next time)
  [ ${#pids[@]} -eq 0 ] || trap 'kill -TERM "${pids[@]}" 2>/dev/null; wait; exit 143' TERM INT
  for i in "${pids[@]}"; do wait "$i" || failed=1; done
  trap - TERM INT
  return $failed
}

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ]; then
  echo "$(date '+%F %T') Stage 1: phones"
  restore phones "${phones[@]}"
  sweep "$seeds" $out/phones "${phones[@]}"
fi

if [ $stage -le 2 ] && [ $stop_stage -ge 2 ]; then
  echo "$(date '+%F %T') Stage 2: words"
  restore words "${words[@]}"
  sweep "$word_seeds" $out/words "${words[@]}"
fi

if [ $stage -le 3 ] && [ $stop_stage -ge 3 ] && [ -n "$more_seeds" ]; then
  echo "$(date '+%F %T') Stage 3: phones, more seeds"
  restore phones "${phones[@]}"
  sweep "$more_seeds" $out/phones "${phones[@]}"
fi

if [ $stage -le 4 ] && [ $stop_stage -ge 4 ]; then
  echo "$(date '+%F %T') Stage 4: tables"
  for task in phones words; do
    [ -d "$out/$task" ] && python compare.py archive "$out/$task" "$kept/$task"
  done
  # RESULTS.md gets the tables, README.md the claims' verdicts alone, from the same runs
  if [ -d $kept/phones ]; then
    python compare.py table $kept/phones --baseline MINI_liGRU --claims results/claims_phones.tsv --pending-ok --target 1.5 \
      --markdown RESULTS.md --section study-layout2-phones --plots results/study_layout2_phones
    python compare.py table $kept/phones --claims results/claims_phones.tsv --pending-ok --markdown README.md \
      --section claims-phones --claims-only > /dev/null
  fi
  if [ -d $kept/words ]; then
    python compare.py table $kept/words --baseline MINIW_liGRU --pairs $word_pairs --claims results/claims_words.tsv \
      --pending-ok --target 1.5 --markdown RESULTS.md --section study-layout2-words --plots results/study_layout2_words
    python compare.py table $kept/words --claims results/claims_words.tsv --pending-ok --markdown README.md \
      --section claims-words --claims-only > /dev/null
  fi
fi
