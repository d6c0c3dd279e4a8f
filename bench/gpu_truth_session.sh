#!/usr/bin/env bash
# One device call on a 2-GPU machine: the GPU truth harness in two lanes at once, one GPU each,
# then (optionally) GPU-marked tests on lane 0's GPU and multi-GPU tests on both.
#   OUT=... [P_WORKLOADS=a,b] [T_WORKLOADS=c,d] [T_PARTS=treat] [GPU_TESTS="tests/x.py"] \
#     [MULTIGPU_TESTS="tests/y.py"] bash bench/gpu_truth_session.sh [seconds]
# Lane 0 runs the probes part of P_WORKLOADS, lane 1 the T_PARTS of T_WORKLOADS. At most 7 files
# come back: each lane's gpu_truth.{json,txt}, logs.tgz, gpu_tests.txt, multigpu.txt.
set -u
OUT=${OUT:-/tmp/gpu-truth}
LIMIT=${1:-540}
P_WORKLOADS=${P_WORKLOADS:-mlp,transformer,conv,loader,hostsync,compiled}
T_WORKLOADS=${T_WORKLOADS:-mlp,loader,conv,transformer}
T_PARTS=${T_PARTS:-treat}
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
start=$(date +%s)
mkdir -p "$OUT/p" "$OUT/t" /tmp/gt-logs
(
  CUDA_VISIBLE_DEVICES=0 timeout "$LIMIT" python3 bench/gpu_truth.py --parts probes \
    --workloads "$P_WORKLOADS" --out "$OUT/p" > /tmp/gt-logs/p-stdout.txt 2>&1
  if [ -n "${GPU_TESTS:-}" ]; then
    left=$(( LIMIT - ($(date +%s) - start) - 5 ))
    CUDA_VISIBLE_DEVICES=0 timeout "$left" python3 -m pytest -q -p no:cacheprovider -m gpu -rs $GPU_TESTS \
      > "$OUT/gpu_tests.txt" 2>&1
  fi
) &
CUDA_VISIBLE_DEVICES=1 timeout "$LIMIT" python3 bench/gpu_truth.py --parts "$T_PARTS" \
  --workloads "$T_WORKLOADS" --out "$OUT/t" > /tmp/gt-logs/t-stdout.txt 2>&1 &
wait
if [ -n "${MULTIGPU_TESTS:-}" ]; then
  left=$(( LIMIT - ($(date +%s) - start) - 5 ))
  [ "$left" -gt 20 ] && timeout "$left" python3 -m pytest -q -p no:cacheprovider -m multigpu -rs $MULTIGPU_TESTS \
    > "$OUT/multigpu.txt" 2>&1
fi
for l in p t; do [ -f "$OUT/$l/gpu_truth.log" ] && mv "$OUT/$l/gpu_truth.log" /tmp/gt-logs/$l-gpu_truth.log; done
tar czf "$OUT/logs.tgz" -C /tmp gt-logs
tail -n 40 "$OUT/p/gpu_truth.txt" "$OUT/t/gpu_truth.txt" 2>/dev/null
tail -n 5 "$OUT/gpu_tests.txt" "$OUT/multigpu.txt" 2>/dev/null
echo "session wall $(( $(date +%s) - start )) s"
