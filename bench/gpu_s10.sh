#!/usr/bin/env bash
# Session 10's GPU call (one H200): where the gpu_healthy loops block, what the probes print on
# them, and attach's overhead on a quiet host. Everything lands under $OUT.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/card.txt"; nvidia-smi --query-gpu=driver_version --format=csv,noheader >> "$OUT/card.txt"
python3 -c "import torch;print(torch.__version__)" >> "$OUT/card.txt"
echo "== loader truth"; timeout 180 python3 bench/loader_truth.py --steps 60 2>&1 | tee "$OUT/loader_truth.txt"
echo "== probes on gpu_healthy"
for spec in "profile profile/gpu_healthy.py" "checkup perf/gpu_healthy.py --steps 40" "checkup profile/gpu_healthy.py" "profile perf/gpu_healthy.py"; do
  set -- $spec; cmd=$1; f=$2; shift 2
  name=$(echo "$cmd-$f" | tr '/' '_')
  d=tests/fixtures/scripts/$(dirname $f)
  ( cd $d && timeout 150 python3 -m torchdoctor $cmd $(basename $f) "$@" --json > "$OUT/$name.json" 2> "$OUT/$name.err" ); echo "$name rc=$?"
  python3 - "$OUT/$name.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("  unreadable:", e); raise SystemExit
for f in r.get("findings", []):
    print("  ", f.get("code"), f.get("severity"), (f.get("title") or "")[:150])
    if f.get("code") == "dataloader-bound":
        print("     evidence:", json.dumps(f.get("evidence"))[:900])
st = (r.get("metrics") or {}).get("steps") or {}
print("   steps:", {k: st.get(k) for k in ("median_ms", "step_ms", "data_wait_ms", "count", "basis") if k in st})
PY
done
echo "== attach overhead"
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PATH=/tmp/site/bin:$PATH PYTHONPATH=$PWD:/tmp/site
py-spy --version
timeout 240 python3 bench/attach_overhead.py --json "$OUT/attach_overhead.json" 2>&1 | tail -40 | tee "$OUT/attach_overhead.txt"
