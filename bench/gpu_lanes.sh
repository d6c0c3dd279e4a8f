#!/usr/bin/env bash
# One device call on a 4-GPU machine, three lanes at once, every result under $OUT (<= 8 files):
#   lane A, GPU 0: the GPU truth harness's probes on $P_WORKLOADS (if set), then $GPU_A tests (-m gpu)
#   lane B, GPU 1: $GPU_B tests (-m gpu)
#   lane C, GPUs 2,3: $MULTI tests (-m multigpu; $MULTI_K narrows with -k)
# Tests run with -v so that a lane killed at its limit still names what passed and failed.
#   OUT=... P_WORKLOADS=hostsync GPU_A="tests/a.py" GPU_B="tests/b.py" MULTI="tests/c.py" \
#     bash bench/gpu_lanes.sh [seconds]
set -u
OUT=${OUT:-/tmp/gpu-lanes}
LIMIT=${1:-540}
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
start=$(date +%s)
mkdir -p "$OUT"
{ nvidia-smi -L; python3 -c 'import torch,sys; print(sys.version.split()[0], torch.__version__)'; nproc; } > "$OUT/machine.txt" 2>&1
left() { echo $(( LIMIT - ($(date +%s) - start) - 5 )); }
pt() {  # marker devices file -- tests...
  local m=$1 dev=$2 f=$3; shift 3
  CUDA_VISIBLE_DEVICES=$dev timeout "$(left)" python3 -m pytest -v -p no:cacheprovider -m "$m" -rfEs \
    --tb=short "$@" > "$OUT/$f" 2>&1
}
(
  if [ -n "${P_WORKLOADS:-}" ]; then
    CUDA_VISIBLE_DEVICES=0 timeout "$(left)" python3 bench/gpu_truth.py --parts probes \
      --workloads "$P_WORKLOADS" --out "$OUT/p" > /dev/null 2>&1
    rm -f "$OUT/p/gpu_truth.log"
  fi
  [ -n "${GPU_A:-}" ] && pt gpu 0 gpu_a.txt $GPU_A
) &
( [ -n "${GPU_B:-}" ] && pt gpu 1 gpu_b.txt $GPU_B ) &
( [ -n "${MULTI:-}" ] && pt multigpu 2,3 multigpu.txt ${MULTI_K:+-k "$MULTI_K"} $MULTI ) &
wait
for f in "$OUT"/*.txt; do echo "== $f"; grep -E "passed|failed|FAILED|ERROR" "$f" | tail -n 12; done
echo "session wall $(( $(date +%s) - start )) s"
