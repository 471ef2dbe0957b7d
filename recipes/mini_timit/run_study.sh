#!/usr/bin/env bash
# The unit comparison of RESULTS.md on the built-in corpus: every MINI config at seeds 1-3 on the phone
# task, Li-BRU, Li-GRU and LSTM at seeds 1-3 on the word task, each trained until its dev error stops
# improving; then the same phone sweep with plain RMSprop, the "before" of the seeds fix
# (opt_bias_correction, cfg/README.md); then the tables (with the papers' comparisons as named pairs)
# and the figures. The study trains every unit with one optimiser, RMSprop with the bias-corrected
# square average (opt_bias_correction = True in every architecture), also the configs that ship with
# plain RMSprop: a comparison of units holds everything else equal.
#
#   recipes/mini_timit/run_study.sh                 # everything not yet finished (each phone sweep about 6 h on 2 cores)
#   recipes/mini_timit/run_study.sh --stage 4       # only the tables and figures, from the runs so far
#
# The schedule (the budget): at most 24 epochs, as the papers' TIMIT recipes; the rate halves after an
# epoch that does not improve the dev frame error by 0.1 % (relative), as in the papers; a run stops
# after 2 epochs in a row without a new best dev frame error, and its best epoch's weights are decoded
# ([exp] patience, cfg/README.md). Everything else is each config's own.
#
# Stages (a killed stage resumes where it stopped: compare.py skips finished runs and run_exp.py
# resumes an unfinished one from its last checkpoint):
#   1 phones   compare.py sweep of the MINI configs -> <out>/phones/<config>/seed<N>
#   2 words    compare.py sweep of MINIW_liBRU, MINIW_liGRU, MINIW_LSTM -> <out>/words/...
#   3 plain    stage 1 again with opt_bias_correction = False in every architecture (plain RMSprop, all
#              configs as they were before the seeds fix) -> <out>/phones_plain/...; each config is
#              paired with its stage-1 runs, so stage 1 is the "after" of the fix at the study's schedule
#   4 tables   compare.py archive of the finished runs (no weights) into results/study_runs/, which is
#              committed; compare.py table of that into RESULTS.md's generated sections; figures into results/
# A study can take several sittings on several clones: stages 1-3 first copy into <out> the archived
# runs it lacks, so that the sweeps skip them.

# Begin configuration section.
stage=1
stop_stage=4
seeds=1,2,3
jobs=2              # runs at a time, each with cores / jobs threads
out=exp/study
archive=results/study_runs  # the finished runs without weights (stage 4), committed: the study's memory
epochs=24
patience=2
# End configuration section.

set -euo pipefail

usage() {
  cat >&2 <<USAGE
Usage: $0 [options]
 e.g.: $0 --stage 4
Options (defaults in brackets):
  --stage N [$stage]  --stop-stage N [$stop_stage]   first and last stage to run (1-4)
  --seeds LIST [$seeds]   --jobs N [$jobs]   --out DIR [$out]   --archive DIR [$archive]
  --epochs N [$epochs]   --patience N [$patience]   the schedule's budget and stopping rule
USAGE
  exit 1
}

# shellcheck disable=SC1091  # --stop-stage N sets stop_stage, and so on
. "$(dirname "$0")/local/parse_options.sh"
[ $# -eq 0 ] || usage
for n in "$stage" "$stop_stage" "$jobs" "$epochs" "$patience"; do
  case "$n" in ''|*[!0-9]*) echo "$0: Error: --stage, --stop-stage, --jobs, --epochs and --patience take integers, got '$n'" >&2; usage ;; esac
done

cd "$(dirname "$0")/../.."  # the repository: compare.py, cfg/ and RESULTS.md are read from there (and
                            # relative --out and --archive)
schedule=("--exp,n_epochs_tr=$epochs" "--exp,patience=$patience")
kept=$archive

restore() {  # restore TASK: the archived runs of TASK that <out> has not finished, copied there
  local run target
  for run in "$kept/$1"/*/seed*; do
    [ -d "$run" ] || continue
    target=$out/$1/${run#"$kept/$1/"}
    [ -e "$target/.done/decode" ] && continue
    rm -rf "$target" && mkdir -p "$target" && cp -R "$run/." "$target/"
  done
}

phones=(cfg/MINI_liBRU.cfg cfg/MINI_liGRU.cfg cfg/MINI_liBRU_bi.cfg cfg/MINI_liGRU_bi.cfg cfg/MINI_liGRU_bi3.cfg
        cfg/MINI_LBRU.cfg cfg/MINI_GRU.cfg cfg/MINI_GRU_bi.cfg cfg/MINI_LSTM.cfg
        cfg/MINI_UBRU.cfg cfg/MINI_UBRU_kalman.cfg cfg/MINI_UBRU_hmm.cfg cfg/MINI_UBRU_bi.cfg cfg/MINI_liGRU_UBRU.cfg
        cfg/MINI_MGU.cfg)
words=(cfg/MINIW_liBRU.cfg cfg/MINIW_liGRU.cfg cfg/MINIW_LSTM.cfg)

# The papers' comparisons, system:against (results/claims_*.tsv say which paper and table each one
# checks, and what it claims: compare.py --claims adds their verdicts).
phone_pairs=MINI_liBRU:MINI_liGRU,MINI_liBRU_bi:MINI_liGRU_bi
phone_pairs+=,MINI_UBRU_kalman:MINI_UBRU,MINI_UBRU_hmm:MINI_UBRU,MINI_UBRU_kalman:MINI_UBRU_bi,MINI_UBRU_hmm:MINI_UBRU_bi
phone_pairs+=,MINI_liGRU_UBRU:MINI_liGRU_bi,MINI_liGRU_UBRU:MINI_liGRU_bi3
phone_pairs+=,MINI_LBRU:MINI_GRU_bi,MINI_LBRU:MINI_GRU
word_pairs=MINIW_liBRU:MINIW_liGRU,MINIW_LSTM:MINIW_liGRU
# Each config against its plain-RMSprop twin of stage 3 (compare.py names a config run with overrides
# NAME(option=value), the option once however many architectures it is set in): the seeds fix's before
# and after.
fix_pairs=$(for cfg in "${phones[@]}"; do name=$(basename "$cfg" .cfg); printf '%s:%s(opt_bias_correction=False),' "$name" "$name"; done)
fix_pairs=${fix_pairs%,}

sweep_with() {  # sweep_with VALUE OUT CONFIG...: compare.py sweep with opt_bias_correction = VALUE in every
  # architecture a config has (each has its own optimiser), so the configs go in one sweep per number
  # of [architectureN] sections
  local value=$1 to=$2 cfg n i
  shift 2
  local -A by_count=()
  for cfg in "$@"; do
    n=$(grep -c '^\[architecture[0-9]' "$cfg")
    by_count[$n]+="$cfg "
  done
  for n in $(printf '%s\n' "${!by_count[@]}" | sort -n); do
    local optimiser=()
    for i in $(seq 1 "$n"); do optimiser+=("--architecture$i,opt_bias_correction=$value"); done
    # shellcheck disable=SC2086  # the configs' paths have no spaces
    python compare.py sweep ${by_count[$n]} --seeds $seeds --jobs $jobs --out "$to" "${schedule[@]}" "${optimiser[@]}"
  done
}

if [ $stage -le 1 ] && [ $stop_stage -ge 1 ]; then
  echo "$(date '+%F %T') Stage 1: phones"
  restore phones
  sweep_with True $out/phones "${phones[@]}"
fi

if [ $stage -le 2 ] && [ $stop_stage -ge 2 ]; then
  echo "$(date '+%F %T') Stage 2: words"
  restore words
  sweep_with True $out/words "${words[@]}"
fi

if [ $stage -le 3 ] && [ $stop_stage -ge 3 ]; then
  echo "$(date '+%F %T') Stage 3: phones with plain RMSprop"
  restore phones_plain
  sweep_with False $out/phones_plain "${phones[@]}"
fi

if [ $stage -le 4 ] && [ $stop_stage -ge 4 ]; then
  echo "$(date '+%F %T') Stage 4: tables"
  for task in phones words phones_plain; do
    [ -d "$out/$task" ] && python compare.py archive "$out/$task" "$kept/$task"
  done
  python compare.py table $kept/phones --baseline MINI_liGRU --pairs $phone_pairs \
    --claims results/claims_phones.tsv --pending-ok --markdown RESULTS.md --section study-phones \
    --plots results/study_phones
  if [ -d $kept/words ]; then
    python compare.py table $kept/words --baseline MINIW_liGRU --pairs $word_pairs \
      --claims results/claims_words.tsv --pending-ok --markdown RESULTS.md --section study-words \
      --plots results/study_words
  fi
  if [ -d $kept/phones_plain ]; then
    python compare.py table $kept/phones $kept/phones_plain --baseline MINI_liGRU --pairs "$fix_pairs" \
      --pending-ok --markdown RESULTS.md --section study-seeds-fix
  fi
fi
