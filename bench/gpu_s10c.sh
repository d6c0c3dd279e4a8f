#!/usr/bin/env bash
# Session 10, after the merges (instruments in sub-packages, RunOptions, ranked treat/repro): the
# GPU fixtures end to end and the GPU tests of treat, nan and repro, on one GPU, -v so that a run
# cut at its limit still names what passed. $1: seconds for the whole call.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
LIMIT=${1:-540}; start=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - start) - 5 )); }
mkdir -p "$OUT"
timeout "$(left)" python3 -m pytest -v -p no:cacheprovider -m gpu -rfEs --tb=short ${TESTS:-tests/test_fixtures.py tests/test_treat_gpu.py tests/test_nan_gpu.py tests/test_repro_gpu.py} > "$OUT/gpu_tests.txt" 2>&1
grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/gpu_tests.txt" | tail -60
