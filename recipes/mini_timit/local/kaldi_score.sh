#!/usr/bin/env bash
# local/score.sh for Kaldi's decoding scripts (steps/decode.sh, steps/decode_fmllr.sh) in run_kaldi.sh:
# they call "local/score.sh --cmd CMD [opts] <data-dir> <graph-dir> <decode-dir>"; this drops --cmd
# (scoring runs here) and scores with the toolkit's kaldi_decoding_scripts/score.sh, TIMIT's folding.
# Usage: local/score.sh [--cmd CMD] [--min-lmwt N] [--max-lmwt N] <data-dir> <graph-dir> <decode-dir>
set -euo pipefail
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cmd) shift 2 ;;
    --*) args+=("$1" "$2"); shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 3 ] || { echo "Usage: $0 [--cmd CMD] [--min-lmwt N] [--max-lmwt N] <data-dir> <graph-dir> <decode-dir>" >&2; exit 1; }
exec "$here/../../../kaldi_decoding_scripts/score.sh" --scoring timit "${args[@]}" "$@"
