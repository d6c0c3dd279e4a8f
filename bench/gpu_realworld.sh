#!/usr/bin/env bash
# Real public scripts on the GPU machine, plainly and under each probe, in one device call.
# The scripts are NOT in the repository: copy them into the git-ignored folder .gpucarry/ here
# (see docs/realworld.md, "On the GPU") and name it in the device call's `carry`:
#   .gpucarry/nanoGPT/{train.py,model.py,configurator.py,config/,data/shakespeare_char/*}
#   .gpucarry/ddp/{multigpu_torchrun.py,datautils.py}      (pytorch/examples DDP tutorial)
# Usage there:  OUT=/some/dir bash bench/gpu_realworld.sh nanogpt [ddp]
# Writes $OUT/rw_<case>.txt: one line per run (command, exit code, wall s, findings code@severity).
set -u
OUT=${OUT:-/tmp/td-rw}
mkdir -p "$OUT"
ROOT=$PWD
export PYTHONPATH=$ROOT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
TD="python3 -m torchdoctor"

summ() {  # summ JSON_FILE -> "code@severity ..." (or the status when no JSON came back)
  python3 - "$1" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"(no JSON: {type(e).__name__})"); sys.exit()
f = [f"{x['code']}@{x['severity']}" for x in d.get("findings", [])]
m = d.get("metrics", {}).get("steps") or {}
print(f"status={d.get('status')} steps={m.get('count', m.get('n', '?'))} findings: {' '.join(f) or 'none'}")
EOF
}

timed() {  # timed LOG NAME CMD... -> appends "NAME rc wall_s" to LOG
  local log=$1 name=$2; shift 2
  local t0=$(date +%s.%N)
  "$@" > "$OUT/last.stdout" 2> "$OUT/last.stderr"
  local rc=$?
  local t1=$(date +%s.%N)
  printf '%-26s rc=%-3s wall=%6.1fs  ' "$name" "$rc" "$(awk "BEGIN{print $t1 - $t0}")" >> "$log"
}

nanogpt() {
  local log=$OUT/rw_nanogpt.txt w=/tmp/rw-nanogpt
  rm -rf $w; mkdir -p $w; cp -r .gpucarry/nanoGPT/* $w/
  cd $w
  # the repo's own shakespeare_char config (6 layers, 384 wide, block 256, batch 64), 300 iterations
  local args=(config/train_shakespeare_char.py --device=cuda --dtype=bfloat16 --compile=False
              --eval_interval=100 --eval_iters=20 --log_interval=50 --max_iters=300 --lr_decay_iters=300
              --warmup_iters=20 --always_save_checkpoint=True)
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c 'import torch; print(torch.__version__)'; } > "$log"
  for round in 1 2; do
    timed "$log" "plain#$round" python3 train.py "${args[@]}" --out_dir=$w/out-plain; echo >> "$log"
    for p in checkup profile memory nan; do
      timed "$log" "$p#$round" $TD $p --json --steps 0 --timeout 300 --out $w/td-$p-$round train.py "${args[@]}" --out_dir=$w/out-$p
      cp "$OUT/last.stdout" "$OUT/nanogpt_${p}.json"
      summ "$OUT/last.stdout" >> "$log"
    done
  done
  timed "$log" "checkpoint-audit" $TD checkpoint-audit --json $w/out-plain/ckpt.pt
  summ "$OUT/last.stdout" >> "$log"
  cd "$ROOT"
}

ddp() {
  local log=$OUT/rw_ddp.txt w=/tmp/rw-ddp
  rm -rf $w; mkdir -p $w; cp .gpucarry/ddp/* $w/
  cd $w
  { nvidia-smi --query-gpu=name --format=csv,noheader | tr '\n' ' '; echo; } > "$log"
  for round in 1 2; do
    rm -f snapshot.pt
    timed "$log" "plain torchrun#$round" python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
      multigpu_torchrun.py 20 5 --batch_size 32; echo >> "$log"
    cp snapshot.pt snapshot-plain.pt 2>/dev/null
    for p in checkup dist; do
      rm -f snapshot.pt
      timed "$log" "$p np2#$round" $TD $p --json --steps 0 --timeout 300 --nproc-per-node 2 --out $w/td-$p-$round \
        multigpu_torchrun.py 20 5 --batch_size 32
      cp "$OUT/last.stdout" "$OUT/ddp_${p}.json"
      summ "$OUT/last.stdout" >> "$log"
    done
  done
  timed "$log" "checkpoint-audit" $TD checkpoint-audit --json $w/snapshot-plain.pt
  summ "$OUT/last.stdout" >> "$log"
  timed "$log" "dist self-test" $TD dist --json --nproc-per-node 2
  summ "$OUT/last.stdout" >> "$log"
  cd "$ROOT"
}

for c in ${*:-nanogpt}; do "$c"; done
rm -f "$OUT/last.stdout" "$OUT/last.stderr"
