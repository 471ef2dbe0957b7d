#!/usr/bin/env bash
# Copies a study's archived runs back into its output folder, so that compare.py sweep skips them: the runs of
# the named configs that <out>/<part> has not finished (the configs' alone: two sweeps of other configs never
# copy the same run). What the study scripts (run_study.sh, run_lfmmi.sh) do before each sweep.
#
#   usage: local/restore_runs.sh ARCHIVE OUT PART CONFIG...
#   e.g.:  local/restore_runs.sh results/study_runs/layout2 exp/study_layout2 words cfg/MINIW_liGRU.cfg
# An argument that is no config (a sweep's --section,option=value) is passed over.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 ARCHIVE OUT PART CONFIG..." >&2
  exit 1
fi
archive=$1 out=$2 part=$3
shift 3
for cfg in "$@"; do
  case "$cfg" in *.cfg) ;; *) continue ;; esac
  name=$(basename "$cfg" .cfg)
  for run in "$archive/$part/$name"/seed*; do
    [ -d "$run" ] || continue
    target=$out/$part/$name/${run##*/}
    [ -e "$target/.done/decode" ] && continue
    rm -rf "$target" && mkdir -p "$target" && cp -R "$run/." "$target/"
  done
done
