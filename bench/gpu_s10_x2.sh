#!/usr/bin/env bash
# Session 10's 2-GPU call (issue 29 and 30 acceptance on NCCL). PART=a|b:
#  a: the collectives table vs the trace (tests + bench), Flight Recorder cost and launched hang
#  b: checkup's in-step overhead on the FSDP2 LM (alternating rounds), pytorch/examples FSDP2/TP
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/card.txt"
T="python3 -m pytest -q -p no:cacheprovider -v --tb=short -rs"
if [ "${PART:-a}" = a ]; then
  timeout 200 $T -m multigpu tests/test_dist_comm.py 2>&1 | tail -15 > "$OUT/a_dist_comm.txt"
  timeout 150 python3 bench/fsdp2_collectives.py --nproc 2 > "$OUT/a_fsdp2_collectives.txt" 2>&1
  timeout 120 python3 bench/fr_env_cost.py --backend nccl --rounds 4 > "$OUT/a_fr_cost.txt" 2>&1
  timeout 100 $T -m multigpu tests/test_dist_script.py -k nccl_hang 2>&1 | tail -8 > "$OUT/a_nccl_hang.txt"
  tail -5 "$OUT"/a_*.txt
else
  timeout 330 python3 bench/fsdp2_overhead.py --nproc 2 --rounds 3 > "$OUT/b_fsdp2_overhead.txt" 2>&1
  tail -14 "$OUT/b_fsdp2_overhead.txt"
  timeout 240 bash bench/gpu_dist_examples.sh 2 "${WHICH:-fsdp2}" > /dev/null 2>&1
  cat "$OUT/dist_examples.txt"
fi
