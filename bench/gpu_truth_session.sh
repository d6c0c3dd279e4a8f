#!/usr/bin/env bash
# One device call for the GPU truth harness on a 2-GPU machine: the probes part on GPU 0 and the
# treat part on GPU 1 at the same time (each part times one workload at a time on its own GPU).
# Usage there: OUT=... bash bench/gpu_truth_session.sh [seconds]
set -u
OUT=${OUT:-/tmp/gpu-truth}
LIMIT=${1:-540}
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT/p" "$OUT/t"
CUDA_VISIBLE_DEVICES=0 timeout "$LIMIT" python3 bench/gpu_truth.py --parts probes --out "$OUT/p" \
  > "$OUT/p/stdout.txt" 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout "$LIMIT" python3 bench/gpu_truth.py --parts treat \
  --workloads mlp,loader,conv,transformer --out "$OUT/t" > "$OUT/t/stdout.txt" 2>&1 &
wait
tail -n 60 "$OUT/p/gpu_truth.txt" "$OUT/t/gpu_truth.txt" 2>/dev/null || tail -n 30 "$OUT"/*/stdout.txt
