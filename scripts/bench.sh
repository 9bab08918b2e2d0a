#!/usr/bin/env bash
# `make bench`: runs every benchmark program built from bench/. Each prints, last,
# one JSON object per figure: {"bench","metric","value","unit","anchor","anchor_value","ratio"}
# (C++ benchmarks print it through bench/figure.h).
set -uo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
rc=0
for b in "$build"/bench/bench_*; do
  [ -x "$b" ] || continue
  echo "== $(basename "$b")" >&2
  "$b" || { echo "bench: $(basename "$b") failed" >&2; rc=1; }
done
exit $rc
