#!/usr/bin/env bash
# pytorch/examples distributed/FSDP2 and tensor_parallelism under every probe on N GPUs (issue 29
# item 5). The examples are not in the repo: fetch github:pytorch/examples, copy its distributed/
# folder to .ext/distributed (git-ignored) and carry it to the GPU machine (carry: [".ext"]).
# Each run gets a fresh copy of the example's folder (FSDP2/example.py resumes from ./checkpoints).
# Writes $OUT/dist_examples.txt (one block per run: exit, wall, findings) and a plain-run wall per
# example (torchrun, no torchdoctor) for the overhead ratio.
#   bash bench/gpu_dist_examples.sh [N=2] [which=all|fsdp2|tp]
set -u
cd "$(dirname "$0")/.."
N=${1:-2}; WHICH=${2:-all}
export PYTHONPATH=$PWD NCCL_NVLS_ENABLE=0
SRC=$PWD/.ext/distributed
[ -d "$SRC" ] || { echo "no $SRC: fetch pytorch/examples and copy distributed/ there"; exit 2; }
mkdir -p "$OUT"; LOG=$OUT/dist_examples.txt
summ() {  # $1 report json, $2 label, $3 rc, $4 wall
  python3 - "$1" "$2" "$3" "$4" <<'PY' | tee -a "$LOG"
import json, sys
path, label, rc, wall = sys.argv[1:]
try:
    r = json.load(open(path))
except Exception as e:
    print(f"{label}: exit {rc}, wall {wall} s, no JSON report ({e})"); raise SystemExit
fs = r.get("findings", [])
print(f"{label}: exit {rc}, wall {wall} s, {len(fs)} findings")
for f in fs:
    ev = f.get("evidence") or {}
    print(f"   {f.get('code')}@{f.get('severity')} rank={ev.get('rank', f.get('rank'))}: {(f.get('title') or '')[:220]}")
m = r.get("metrics") or {}
c = m.get("collectives")
if c:
    for row in c.get("per_rank", []):
        t = row.get("total", {})
        print(f"   collectives rank {row.get('rank')}: {t.get('ms')} ms/step, exposed {t.get('exposed_ms')} ms, step {row.get('step_ms')} ms, kinds {[k.get('kind') for k in row.get('kinds', [])]}")
ranks = m.get("ranks") or {}
for row in (ranks.get("per_rank") or ranks.get("rows") or [])[:4]:
    print(f"   rank {row.get('rank')}: median step {row.get('median_step_ms')} ms")
PY
}
run_one() {  # $1 example dir, $2 script, $3 label, $4.. command (plain | probe name), then script args after --
  local dir=$1 script=$2 label=$3 cmd=$4; shift 4
  local work; work=$(mktemp -d); cp -r "$SRC/$dir/." "$work/"
  local t0; t0=$(date +%s.%N)
  if [ "$cmd" = plain ]; then
    ( cd "$work" && timeout 300 python3 -m torch.distributed.run --standalone --nproc-per-node "$N" "$script" "$@" > "$work/out.txt" 2>&1 ); rc=$?
    echo "$label: plain torchrun exit $rc, wall $(python3 -c "import time;print(round(time.time()-$t0,1))") s" | tee -a "$LOG"
    tail -3 "$work/out.txt" | sed 's/^/   | /' | tee -a "$LOG"
  else
    ( cd "$work" && timeout 400 python3 -m torchdoctor "$cmd" --json --nproc-per-node "$N" --timeout 300 "$script" "$@" > "$work/r.json" 2> "$work/err.txt" ); rc=$?
    summ "$work/r.json" "$label $cmd" "$rc" "$(python3 -c "import time;print(round(time.time()-$t0,1))")"
    grep -i "traceback\|internal" "$work/err.txt" | head -3 | sed 's/^/   ! /' | tee -a "$LOG"
    if [ "$cmd" = checkup ] && [ -d "$work/checkpoints" ]; then
      for ck in $(find "$work/checkpoints" -mindepth 2 -maxdepth 2 -type d | head -2); do
        ( timeout 120 python3 -m torchdoctor checkpoint-audit --json "$ck" > "$work/ck.json" 2>/dev/null ); summ "$work/ck.json" "$label checkpoint-audit $(basename $(dirname $ck))" $? -
      done
    fi
  fi
  rm -rf "$work"
}
echo "# $(nvidia-smi -L | head -$N | tr '\n' ' ') torch $(python3 -c 'import torch;print(torch.__version__)'), $N ranks" | tee "$LOG"
if [ "$WHICH" = all ] || [ "$WHICH" = fsdp2 ]; then
  for cmd in plain checkup profile memory nan dist; do
    run_one FSDP2 example.py "FSDP2/example.py --mixed-precision --dcp-api" $cmd --mixed-precision --dcp-api
  done
  run_one FSDP2 example.py "FSDP2/example.py (fp32, dtensor api)" checkup
fi
if [ "$WHICH" = all ] || [ "$WHICH" = tp ]; then
  for ex in tensor_parallel_example.py sequence_parallel_example.py; do
    for cmd in plain checkup profile nan; do run_one tensor_parallelism $ex "TP/$ex" $cmd; done
  done
  [ "$N" -ge 4 ] && for cmd in plain checkup profile; do run_one tensor_parallelism fsdp_tp_example.py "TP/fsdp_tp_example.py" $cmd; done
fi
echo "# done" | tee -a "$LOG"
