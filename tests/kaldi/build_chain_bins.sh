#!/usr/bin/env bash
# Builds Kaldi's chain-est-phone-lm and chain-make-den-fst in a CPU-only Kaldi tree, for the opt-in
# tests of tests/kaldi/test_kaldi_chain.py (our phone LM and denominator graph against Kaldi's).
#
#   usage: tests/kaldi/build_chain_bins.sh KALDI_ROOT
#
# A Kaldi build made for testing (the src/{base,matrix,util,tree,hmm,fstext,lat} libraries and their
# binaries) lacks src/chainbin, whose Makefile links nnet3 and the CUDA matrix library. These two tools
# need only the chain library, which needs the CUDA matrix library; both build without CUDA (on the CPU).
# So: those two libraries, then the two binaries linked against only what they use. Idempotent (make).
set -euo pipefail

if [[ $# -ne 1 || ! -f $1/src/kaldi.mk ]]; then
  echo "usage: $0 KALDI_ROOT   (a configured Kaldi tree: src/kaldi.mk exists)" >&2
  exit 2
fi
src=$1/src
jobs=${KALDI_JOBS:-2}
make -C "$src/cudamatrix" -j "$jobs"
make -C "$src/chain" -j "$jobs"
# chainbin's own ADDLIBS (nnet3 ...) replaced by what these two binaries use
make -C "$src/chainbin" chain-est-phone-lm chain-make-den-fst \
  ADDLIBS="../chain/kaldi-chain.a ../cudamatrix/kaldi-cudamatrix.a ../lat/kaldi-lat.a ../fstext/kaldi-fstext.a \
           ../hmm/kaldi-hmm.a ../tree/kaldi-tree.a ../util/kaldi-util.a ../matrix/kaldi-matrix.a ../base/kaldi-base.a"
echo "$src/chainbin/chain-est-phone-lm and chain-make-den-fst are built"
