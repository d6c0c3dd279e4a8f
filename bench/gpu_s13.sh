#!/usr/bin/env bash
# Session 13's device calls: unseen public scripts on one GPU, every probe, against their own
# printed numbers. Needs `.gpucarry/` (git-ignored; carried): llm.c's train_gpt2.py, a tiktoken
# stand-in, synthetic tokens; pytorch/examples imagenet/main.py and mnist_hogwild/ with synthetic
# MNIST (docs/realworld.md, "Session 13"). Usage there: OUT=... PART=a|b|c|d|e|f|g|h bash bench/gpu_s13.sh
set -u
OUT=${OUT:-/tmp/td-s13}
mkdir -p "$OUT"
ROOT=$PWD
export PYTHONPATH=$ROOT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch,sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
  nproc; uptime; git -C "$ROOT" log --oneline -1 2>/dev/null; } > "$OUT/machine_${PART:-a}.txt" 2>&1
summ() {  # summ NAME JSON -> one line: status, steps, step ms, findings with titles
  python3 - "$@" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
try:
    d = json.load(open(path))
except Exception as e:
    print(f"{name}: no JSON ({type(e).__name__})"); sys.exit()
st = d.get("metrics", {}).get("steps") or {}
print(f"{name}: status={d.get('status')} steps={st.get('count')} median_ms={st.get('median_step_ms')} "
      f"share={st.get('share')} basis={st.get('share_basis')}")
for f in d.get("findings", []):
    print(f"  {f['code']}@{f['severity']}: {f['title'][:300]}")
PY
}
case ${PART:-a} in
a)
  timeout 330 python3 bench/printed_truth.py --case llmc --rounds 2 --out "$OUT/llmc" > "$OUT/llmc.txt" 2>&1
  echo "llmc rc=$?" >> "$OUT/machine_a.txt"
  timeout 240 python3 bench/printed_truth.py --case llmc_compile --probes checkup,compile --rounds 1 \
      --timeout 200 --out "$OUT/llmcc" > "$OUT/llmc_compile.txt" 2>&1
  echo "llmc_compile rc=$?" >> "$OUT/machine_a.txt"
  tar czf "$OUT/runs_a.tgz" -C "$OUT" llmc llmcc 2>/dev/null; rm -rf "$OUT/llmc" "$OUT/llmcc"
  ;;
b)
  # the new gemm-unaligned finding and the GPU-idle bound of host-sync/pageable: GPU fixtures
  # (their headers), the cure measured, llm.c under profile again
  timeout 60 python3 bench/gemm_align.py --json "$OUT/gemm_align.json" > "$OUT/gemm_align.txt" 2>&1
  timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_fixtures.py tests/test_memory_cli.py \
      -k "profile/ or memory/ or run/ or memory_cli" > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests rc=$?" >> "$OUT/gpu_tests.txt"
  timeout 100 python3 bench/printed_truth.py --case llmc --probes profile --rounds 1 --out "$OUT/llmcp" > "$OUT/llmc_profile.txt" 2>&1
  cp "$OUT/llmcp/td-profile-1/report.json" "$OUT/llmc_profile.json" 2>/dev/null; rm -rf "$OUT/llmcp"
  ;;
c)
  C=$ROOT/.gpucarry
  log=$OUT/examples.txt; : > "$log"
  # imagenet: ResNet-50 on FakeData (PIL images made on the CPU by 8 workers), 60 steps; the
  # script's own meters (Time, Data: averages) are in its output, printed every 10 steps
  mkdir -p /tmp/imnet && cd /tmp/imnet
  for p in checkup profile; do
    t0=$(date +%s.%N)
    timeout 300 python3 -m torchdoctor $p --json --steps 60 --timeout 240 "$C/ex/imagenet/main.py" --dummy \
        -a resnet50 -b 128 -j 8 -p 10 --epochs 1 > "$OUT/imnet_$p.json" 2> "$OUT/imnet_$p.err"
    echo "imagenet $p rc=$? wall=$(python3 -c "import time; print(round(time.time()-$t0,1))")" >> "$log"
    summ "imagenet $p" "$OUT/imnet_$p.json" >> "$log"
    grep -E "^Epoch: \[0\]\[ *(10|20|30|40|50|60)/" "$OUT/imnet_$p.err" | cut -c1-160 >> "$log"
  done
  # mnist_hogwild on CUDA: training in two spawned processes
  mkdir -p /tmp/hog/run && cp -r "$C/data" /tmp/hog/data && cd /tmp/hog/run
  timeout 200 python3 -m torchdoctor checkup --json "$C/ex/mnist_hogwild/main.py" --cuda --epochs 1 \
      > "$OUT/hog.json" 2> "$OUT/hog.err"
  echo "hogwild checkup rc=$?" >> "$log"; summ "hogwild checkup" "$OUT/hog.json" >> "$log"
  cd "$ROOT"
  tar czf "$OUT/errs_c.tgz" -C "$OUT" imnet_checkup.err imnet_profile.err hog.err 2>/dev/null
  rm -f "$OUT"/*.err
  ;;
d)
  # treat on llm.c, as a new user would: which trials apply and what it measures
  cd "$ROOT/.gpucarry/llmc"
  PYTHONPATH=$ROOT:$ROOT/.gpucarry/shim timeout 540 python3 -m torchdoctor treat --json --steps 40 --timeout 500 \
      --out "$OUT/treat" train_gpt2.py --input_bin ../tok/train.bin --model d12 --batch_size 16 \
      --sequence_length 1024 --total_batch_size 16384 --dtype bfloat16 --flash 1 --tensorcores 1 \
      --num_iterations 40 --write_tensors 0 --device cuda > "$OUT/treat.json" 2> "$OUT/treat.err"
  echo "treat rc=$?" >> "$OUT/machine_d.txt"
  tail -c 6000 "$OUT/treat.err" > "$OUT/treat_tail.txt"; rm -f "$OUT/treat.err"
  cp "$OUT/treat/report.json" "$OUT/treat_report.json" 2>/dev/null; rm -rf "$OUT/treat"
  cd "$ROOT"
  ;;
e)
  # treat's compile trial on llm.c measured ~0 s of compiling on the H200 (37 s on the CPU box):
  # the same model compiled without torchdoctor, then the trial with dynamo's logs
  cd "$ROOT/.gpucarry/llmc"
  PYTHONPATH=$ROOT/.gpucarry/shim:. timeout 200 python3 compile_probe.py > "$OUT/compile_plain.txt" 2>&1
  echo "plain compile rc=$?" >> "$OUT/compile_plain.txt"
  TORCH_LOGS=graph_breaks,recompiles PYTHONPATH=$ROOT:$ROOT/.gpucarry/shim timeout 300 python3 -m torchdoctor treat \
      --try compile --json --steps 12 --timeout 250 --out "$OUT/tr" train_gpt2.py --input_bin ../tok/train.bin \
      --model d12 --batch_size 16 --sequence_length 1024 --total_batch_size 16384 --dtype bfloat16 --flash 1 \
      --tensorcores 1 --num_iterations 12 --write_tensors 0 --device cuda > "$OUT/treat_e.json" 2> "$OUT/treat_e.err"
  echo "treat rc=$?" >> "$OUT/compile_plain.txt"
  grep -v "^step " "$OUT/treat_e.err" | tail -c 8000 > "$OUT/treat_e_tail.txt"; rm -f "$OUT/treat_e.err"; rm -rf "$OUT/tr"
  cd "$ROOT"
  ;;
f)
  # the same compiled model under checkup (the script compiles itself), and treat's trial on it
  cd "$ROOT/.gpucarry/llmc"
  TORCH_LOGS=graph_breaks,recompiles PYTHONPATH=$ROOT:$ROOT/.gpucarry/shim:. timeout 200 python3 -m torchdoctor checkup \
      --steps 0 --timeout 180 compile_probe.py > "$OUT/f_checkup.txt" 2>&1
  echo "checkup rc=$?" >> "$OUT/f_checkup.txt"
  cd "$ROOT"
  ;;
g)
  # is it flash attention? the compiled model with FLASH=1 without torchdoctor; treat's trial with --flash 0
  cd "$ROOT/.gpucarry/llmc"
  FLASH=1 PYTHONPATH=$ROOT/.gpucarry/shim:. timeout 100 python3 compile_probe.py > "$OUT/g_plain_flash.txt" 2>&1
  PYTHONPATH=$ROOT:$ROOT/.gpucarry/shim timeout 200 python3 -m torchdoctor treat --try compile --json --steps 12 \
      --timeout 150 train_gpt2.py --input_bin ../tok/train.bin --model d12 --batch_size 16 --sequence_length 1024 \
      --total_batch_size 16384 --dtype bfloat16 --flash 0 --tensorcores 1 --num_iterations 12 --write_tensors 0 \
      --device cuda > "$OUT/g_treat.json" 2> "$OUT/g_treat.err"
  grep "torchdoctor treat" "$OUT/g_treat.err" > "$OUT/g_treat_tail.txt"; rm -f "$OUT/g_treat.err"
  cd "$ROOT"
  ;;
h)
  # treat's compile trial with dynamo's counters recorded in the trial's entry
  cd "$ROOT/.gpucarry/llmc"
  PYTHONPATH=$ROOT:$ROOT/.gpucarry/shim timeout 170 python3 -m torchdoctor treat --try compile --json --steps 8 \
      --timeout 120 train_gpt2.py --input_bin ../tok/train.bin --model d12 --batch_size 16 --sequence_length 1024 \
      --total_batch_size 16384 --dtype bfloat16 --flash 1 --tensorcores 1 --num_iterations 8 --write_tensors 0 \
      --device cuda > "$OUT/h_treat.json" 2> /dev/null
  cd "$ROOT"
  ;;
esac
