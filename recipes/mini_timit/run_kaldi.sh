#!/usr/bin/env bash
# Kaldi's own GMM systems on the built-in corpus, stage by stage as Kaldi's egs/timit/s5 builds them:
# a monophone system, tri1 (deltas), tri2 (LDA + MLLT), tri3 (speaker-adaptive training), a tri3 decode
# of dev and test (the GMM baseline PER), fMLLR alignments of every set and fMLLR features. It leaves the
# layout that cfg/TIMIT_*.cfg read, so the worked example of training on Kaldi's outputs is
#
#   KALDI_ROOT=/path/to/kaldi recipes/mini_timit/run_kaldi.sh recipes/mini_timit exp/kaldi_mini_timit
#   TIMIT_FMLLR=exp/kaldi_mini_timit/data-fmllr-tri3 TIMIT_EXP=exp/kaldi_mini_timit/exp \
#     python run_exp.py cfg/TIMIT_liBRU.cfg
#
# Stages (each leaves <kaldi-dir>/.done/<n>; a finished stage is skipped unless --stage N asks to redo
# it and the ones after it):
#   0 data       data/{train,dev,test}: the corpus's utterances with its 13 MFCC + per-speaker CMVN
#                (TIMIT s5 trains its GMMs on MFCC), data/lang: the corpus's lang dir (phone bigram G.fst)
#   1 mono       steps/train_mono.sh, steps/align_si.sh --boost-silence 1.25 -> exp/mono_ali
#   2 tri1       steps/train_deltas.sh, steps/align_si.sh -> exp/tri1_ali
#   3 tri2       steps/train_lda_mllt.sh (splice +-3), steps/align_si.sh --use-graphs true -> exp/tri2_ali
#   4 tri3       steps/train_sat.sh, utils/mkgraph.sh -> exp/tri3/graph, steps/decode_fmllr.sh dev and test;
#                the scale and penalty chosen on dev, test scored with them -> exp/tri3/PER
#   5 align      steps/align_fmllr.sh -> exp/tri3_ali, exp/tri3_ali_dev, exp/tri3_ali_test
#   6 fmllr      steps/nnet/make_fmllr_feats.sh -> data-fmllr-tri3/{train,dev,test}
#
# Needs a Kaldi build (the binaries of src/{bin,featbin,gmmbin,latbin,fstbin}, egs/wsj/s5/{steps,utils}):
# README, "Testing against Kaldi". The scoring is the toolkit's (kaldi_decoding_scripts/score.sh,
# TIMIT's 48 -> 39 folding), run through local/score.sh as Kaldi's decoding scripts expect.

# Begin configuration section.
stage=              # empty: every stage not yet finished
stop_stage=6
nj=4                # parallel jobs; at most the number of speakers of the smallest set
leaves=1000         # tri1..tri3 tree leaves and Gaussians: TIMIT s5 uses 2500 / 15000 for 3 hours of
gauss=8000          # speech; the default corpus has 1 hour
retry_beam=400      # alignment's second beam (Kaldi's default is 40); a GMM trained on one hour of
                    # speech aligns unseen speakers badly: at 40 it dropped 6 of the 112 dev utterances of
                    # the corpus's first layout, more than run_exp.py's max_missing_fraction lets through
# End configuration section.

set -euo pipefail

usage() {
  cat >&2 <<USAGE
Usage: $0 [options] <corpus-dir> <kaldi-dir>
 e.g.: KALDI_ROOT=~/kaldi $0 recipes/mini_timit exp/kaldi_mini_timit
  <corpus-dir>: a built corpus (recipes/mini_timit/run.sh); <kaldi-dir>: where Kaldi's systems go.
Options (defaults in brackets):
  --stage N [the first unfinished]   --stop-stage N [$stop_stage]   first and last stage to run (0-6)
  --nj N [$nj]         parallel jobs
  --leaves N [$leaves] --gauss N [$gauss]   size of the tri1..tri3 systems
  --retry-beam N [$retry_beam]   beam of the alignments' second try
USAGE
  exit 1
}

# shellcheck disable=SC1091  # --stop-stage N sets stop_stage, and so on
. "$(dirname "$0")/local/parse_options.sh"
[ $# -eq 2 ] || usage
for n in ${stage:-0} "$stop_stage" "$nj" "$leaves" "$gauss" "$retry_beam"; do
  case "$n" in ''|*[!0-9]*) echo "$0: Error: stages, --nj, --leaves, --gauss and --retry-beam take integers, got '$n'" >&2; usage ;; esac
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
corpus=$(cd "$1" && pwd)
mkdir -p "$2"
dir=$(cd "$2" && pwd)

[ -n "${KALDI_ROOT:-}" ] && [ -d "$KALDI_ROOT/src/gmmbin" ] && [ -d "$KALDI_ROOT/egs/wsj/s5/steps" ] || {
  echo "$0: Error: KALDI_ROOT must name a Kaldi build (src/gmmbin, egs/wsj/s5/steps), got '${KALDI_ROOT:-}'" >&2
  exit 1
}
for f in data/train/feats_mfcc.scp data/train/cmvn_mfcc.scp data/lang/G.fst data/lang/topo; do
  [ -f "$corpus/$f" ] || { echo "$0: Error: $corpus/$f is missing: build the corpus first (recipes/mini_timit/run.sh)" >&2; exit 1; }
done

log() { echo "[run_kaldi $(date +%H:%M:%S)] $*"; }

# Kaldi's scripts run from a recipe folder with steps/, utils/, path.sh and local/score.sh.
cd "$dir"
ln -sfn "$KALDI_ROOT/egs/wsj/s5/steps" steps
ln -sfn "$KALDI_ROOT/egs/wsj/s5/utils" utils
mkdir -p local .done
ln -sfn "$here/local/kaldi_score.sh" local/score.sh
cat > path.sh <<PATHS
export KALDI_ROOT=$KALDI_ROOT
export PATH=\$PWD/utils:\$KALDI_ROOT/tools/openfst/bin:$(printf '$KALDI_ROOT/src/%s:' bin featbin gmmbin latbin fstbin)\$PATH
export LC_ALL=C
PATHS
. ./path.sh
export PYTHON=${PYTHON:-$(command -v python3)}  # for the scoring filter (bru_kaldi.scoring)
cmd=utils/run.pl
align_opts="--retry-beam $retry_beam"

# A stage up to stop_stage runs unless it is finished and before --stage (or no --stage was given).
run() {  # n name
  local n=$1
  [ "$n" -le "$stop_stage" ] || return 1
  if [ -f ".done/$n" ] && { [ -z "$stage" ] || [ "$n" -lt "$stage" ]; }; then
    log "stage $n: $2: finished before, skipped"
    return 1
  fi
  log "stage $n: $2"
  rm -f ".done/$n"
  return 0
}
done_stage() { touch ".done/$1"; }

if run 0 "data dirs with MFCC features"; then
  for split in train dev test; do
    mkdir -p data/$split
    for f in text utt2spk spk2utt wav.scp spk2gender; do cp "$corpus/data/$split/$f" data/$split/; done
    cp "$corpus/data/$split/feats_mfcc.scp" data/$split/feats.scp
    cp "$corpus/data/$split/cmvn_mfcc.scp" data/$split/cmvn.scp
    utils/validate_data_dir.sh --no-wav --no-feats data/$split
  done
  ln -sfn "$corpus/data/lang" data/lang
  done_stage 0
fi

if run 1 "monophone system"; then
  steps/train_mono.sh --nj $nj --cmd $cmd data/train data/lang exp/mono
  steps/align_si.sh $align_opts --boost-silence 1.25 --nj $nj --cmd $cmd data/train data/lang exp/mono exp/mono_ali
  done_stage 1
fi

if run 2 "tri1: deltas"; then
  steps/train_deltas.sh --cmd $cmd $leaves $gauss data/train data/lang exp/mono_ali exp/tri1
  steps/align_si.sh $align_opts --nj $nj --cmd $cmd data/train data/lang exp/tri1 exp/tri1_ali
  done_stage 2
fi

if run 3 "tri2: LDA + MLLT"; then
  steps/train_lda_mllt.sh --cmd $cmd --splice-opts "--left-context=3 --right-context=3" \
    $leaves $gauss data/train data/lang exp/tri1_ali exp/tri2
  steps/align_si.sh $align_opts --nj $nj --cmd $cmd --use-graphs true data/train data/lang exp/tri2 exp/tri2_ali
  done_stage 3
fi

if run 4 "tri3: speaker-adaptive training, decoding"; then
  steps/train_sat.sh --cmd $cmd $leaves $gauss data/train data/lang exp/tri2_ali exp/tri3
  utils/mkgraph.sh data/lang exp/tri3 exp/tri3/graph
  for split in dev test; do
    steps/decode_fmllr.sh --nj $nj --cmd $cmd exp/tri3/graph data/$split exp/tri3/decode_$split
  done
  # LM weight and insertion penalty chosen on dev; test scored with exactly those
  best=$(grep -H '%WER' exp/tri3/decode_dev/wer_* | sort -t' ' -k2,2n | awk 'NR == 1')  # not head: SIGPIPE under pipefail
  setting=$(basename "${best%%:*}")             # wer_LMWT_WIP
  lmwt=$(echo "$setting" | cut -d_ -f2); wip=$(echo "$setting" | cut -d_ -f3)
  test_per=$(grep '%WER' "exp/tri3/decode_test/$setting")
  echo "tri3 GMM (LMWT $lmwt, WIP $wip chosen on dev): dev ${best#*:} | test $test_per" | tee exp/tri3/PER
  done_stage 4
fi

if run 5 "fMLLR alignments of every set"; then
  steps/align_fmllr.sh $align_opts --nj $nj --cmd $cmd data/train data/lang exp/tri3 exp/tri3_ali
  steps/align_fmllr.sh $align_opts --nj $nj --cmd $cmd data/dev data/lang exp/tri3 exp/tri3_ali_dev
  steps/align_fmllr.sh $align_opts --nj $nj --cmd $cmd data/test data/lang exp/tri3 exp/tri3_ali_test
  done_stage 5
fi

if run 6 "fMLLR features"; then
  for split in train dev test; do
    ali=exp/tri3_ali$([ $split = train ] || echo _$split)
    steps/nnet/make_fmllr_feats.sh --nj $nj --cmd $cmd --transform-dir $ali \
      data-fmllr-tri3/$split data/$split exp/tri3 data-fmllr-tri3/$split/log data-fmllr-tri3/$split/data
  done
  done_stage 6
fi

log "done: TIMIT_FMLLR=$dir/data-fmllr-tri3 TIMIT_EXP=$dir/exp python $repo/run_exp.py cfg/TIMIT_liBRU.cfg"
[ -f exp/tri3/PER ] && cat exp/tri3/PER
exit 0
