#!/usr/bin/env bash
# One device call that runs the GPU-marked tests and the GPU benchmarks, writing every result
# under $OUT (few files: the device tool returns a handful). Usage on the GPU machine:
#   OUT=/some/dir bash bench/gpu_session.sh [tests] [memory] [nan] [checkup] [attribute]
# GPU_TESTS narrows the test part to some files (default: every gpu-marked test).
# With no argument it runs tests, memory, nan and checkup. Each part has its own time limit.
set -u
OUT=${OUT:-/tmp/td-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
parts=${*:-tests memory nan checkup}
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch,sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
  nproc; uptime
} > "$OUT/machine.txt" 2>&1
for p in $parts; do
  start=$(date +%s)
  case $p in
    tests) timeout 420 python3 -m pytest -q -p no:cacheprovider -m gpu -rs ${GPU_TESTS:-tests} \
             > "$OUT/tests.txt" 2>&1 ;;
    memory) timeout 300 python3 bench/memory_overhead.py --workload gpu_transformer --rounds 3 \
             --json "$OUT/memory_bench.json" > "$OUT/memory_bench.txt" 2>&1 ;;
    nan) timeout 300 python3 bench/nan_overhead.py --workload gpu-transformer --rounds 3 \
             --configs bare,checkup,nan --json "$OUT/nan_bench.json" > "$OUT/nan_bench.txt" 2>&1 ;;
    attribute) timeout 300 python3 bench/nan_overhead.py --workload gpu-transformer --rounds 2 \
             --attribute > "$OUT/nan_attribute.txt" 2>&1 ;;
    checkup) timeout 300 python3 bench/overhead.py --workload gpu_transformer --probe checkup \
             --rounds 3 --json "$OUT/checkup_bench.json" > "$OUT/checkup_bench.txt" 2>&1 ;;
    *) echo "unknown part $p" >> "$OUT/machine.txt" ;;
  esac
  echo "$p: rc $? in $(( $(date +%s) - start )) s" >> "$OUT/machine.txt"
done
