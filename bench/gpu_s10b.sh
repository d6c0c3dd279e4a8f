#!/usr/bin/env bash
# Session 10, second GPU call: profile on the gpu_healthy fixtures (the probe that raised
# dataloader-bound on them), and the GPU tests that assert those fixtures stay clean.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
mkdir -p "$OUT"
for f in profile/gpu_healthy.py perf/gpu_healthy.py; do
  name=profile-$(echo $f | tr '/' '_')
  ( cd tests/fixtures/scripts/$(dirname $f) && timeout 150 python3 -m torchdoctor profile --json $(basename $f) > /tmp/$name.json 2> /tmp/$name.err ); echo "$name rc=$?"
  python3 - /tmp/$name.json <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
r = json.load(open(sys.argv[1]))
print("==", sys.argv[1])
for f in r.get("findings", []):
    print("  ", f.get("code"), f.get("severity"), (f.get("title") or "")[:200])
    if f.get("code") == "dataloader-bound":
        print("     evidence:", json.dumps(f.get("evidence"))[:1500])
m = r.get("metrics") or {}
print("   metric keys:", sorted(m)[:30])
st = m.get("steps") or {}
print("   steps:", json.dumps({k: v for k, v in st.items() if not isinstance(v, (list, dict))})[:800])
dev = st.get("device") or m.get("device")
print("   device:", json.dumps(dev)[:800])
PY
done
timeout 400 python3 -m pytest -q -p no:cacheprovider -v --tb=short -m "gpu or multigpu" tests/test_profile_gpu.py tests/test_runner_gpu.py tests/test_memory_gpu.py 2>&1 | tail -30 | tee "$OUT/gpu_tests.txt"
