"""GPU truth harness: every number torchdoctor prints on a GPU, against the script's own measurement.

One call on a GPU machine (``--parts probes`` and ``--parts treat`` can run on two GPUs at once,
one each: ``CUDA_VISIBLE_DEVICES``). Reference workloads (``bench/workloads/truth_*.py``) time
themselves the careful way (``_truth.py``: a synchronize at each end of the timed window, CUDA
events around each phase, ``memory_allocated`` at every step end, ``max_memory_allocated``).

* **probes**: each workload plain, then under checkup, profile, memory and nan (``--steps 0``: the
  workload's own loop bounds the run, so it writes its numbers in the same process). Rows:
  step time printed vs the workload's window in that run (±10 %), device phase times vs its CUDA
  events (±15 %, phases of at least 10 % of the step), peak memory printed vs
  ``max_memory_allocated`` (±5 %), the workload's ``memory_allocated`` at each step end under the
  probe vs the plain run (no tool-induced memory: within one 2 MiB allocator block), the FLOP
  counter's step time, and no ``memory-growth``/``internal-error`` finding.
* **treat**: ``torchdoctor treat --try …`` on the workloads that have trials, against the same
  change applied by hand (workload flags), A/B in alternating rounds. Rows: each trial's speed-up
  vs the A/B truth (±15 %, when it was measured), no ``adopt`` where the A/B shows no gain beyond
  its noise, no memory finding on treat's baseline.

Prints one table (printed value, truth, ratio, verdict) and writes ``gpu_truth.json`` and
``gpu_truth.txt`` under ``--out``; exits 1 when a row is out of tolerance.

    OUT=$OUT python3 bench/gpu_truth.py --parts probes --out $OUT/p     # GPU 0
    python3 bench/gpu_truth.py --parts treat --out $OUT/t               # GPU 1
    python3 bench/gpu_truth.py --device cpu --workloads mlp --parts probes --out /tmp/t  # smoke
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WL = ROOT / "bench" / "workloads"
PROBES = ("checkup", "profile", "memory", "nan")
TOL_STEP, TOL_PHASE, TOL_PEAK, TOL_SPEEDUP = 0.10, 0.15, 0.05, 0.15
BLOCK = 2 * 2**20  # one large allocator block (2 MiB): tool-induced memory must stay below it
MIN_PHASE_SHARE = 0.10

# name: (script, extra args on CUDA, small args for a CPU smoke run, {trial: flags by hand})
WORKLOADS: dict[str, tuple[str, list[str], list[str], dict[str, list[str]]]] = {
    "mlp": ("truth_mlp.py", [], ["--width", "256", "--batch", "64"],
            {"fused-optimizer": ["--fused"], "tf32": ["--tf32"], "bf16-autocast": ["--bf16"]}),
    "transformer": ("truth_transformer.py", [], ["--layers", "2", "--dim", "64", "--seq", "32",
                                                 "--batch", "2", "--vocab", "100"],
                    {"compile": ["--compile"]}),
    "conv": ("truth_conv.py", [], ["--batch", "4", "--size", "32"],
             {"channels-last": ["--channels-last"], "cudnn-benchmark": ["--cudnn-benchmark"]}),
    "loader": ("truth_loader.py", [], ["--work", "1"],
               {"dataloader-workers=4": ["--workers", "4"], "pin-memory": ["--pin"]}),
    "hostsync": ("truth_hostsync.py", [], ["--depth", "4", "--width", "32"], {}),
    "compiled": ("truth_compiled.py", [], ["--dim", "64", "--depth", "2", "--batch", "64"], {}),
}


def machine() -> str:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        gpu = []
    import platform

    try:
        import torch

        tv = torch.__version__
    except Exception:  # noqa: BLE001
        tv = "?"
    return (f"{gpu[0] if gpu else 'no GPU'}; {os.cpu_count()} CPUs; Python {platform.python_version()}; "
            f"torch {tv}")


class Harness:
    def __init__(self, a):
        self.a = a
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = []
        self.raw: dict = {}
        self.log = open(self.out / "gpu_truth.log", "w")
        self.env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                        PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0")

    # ---- running ------------------------------------------------------------------------------
    def wargs(self, name: str) -> list[str]:
        script, cuda_args, small, _ = WORKLOADS[name]
        args = [str(WL / script), *(cuda_args if self.a.device == "cuda" else [*small, "--device", "cpu"])]
        return args

    def _run(self, cmd: list[str], timeout: float) -> subprocess.CompletedProcess | None:
        t = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env,
                               cwd=str(ROOT))
        except subprocess.TimeoutExpired:
            self.log.write(f"TIMEOUT {timeout}s: {' '.join(cmd)}\n")
            return None
        self.log.write(f"$ {' '.join(cmd)}  [rc {p.returncode}, {time.monotonic() - t:.1f} s]\n"
                       f"{p.stderr[-3000:]}\n")
        self.log.flush()
        return p

    def plain(self, name: str, flags: list[str] = ()) -> dict | None:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            res = f.name
        p = self._run([sys.executable, *self.wargs(name), *flags, "--result", res], 300)
        try:
            return json.loads(Path(res).read_text()) if p is not None and p.returncode == 0 else None
        except (OSError, ValueError):
            return None
        finally:
            Path(res).unlink(missing_ok=True)

    def probe(self, name: str, probe: str) -> tuple[dict | None, dict | None]:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            res = f.name
        extra = ["--skip", "2", "--window", "2"] if probe == "profile" else []
        cmd = [sys.executable, "-m", "torchdoctor", probe, "--json", "--steps", "0", "--timeout", "300",
               *extra, *self.wargs(name), "--result", res]
        p = self._run(cmd, 360)
        rep = None
        if p is not None:
            try:
                rep = json.loads(p.stdout)
            except ValueError:
                rep = None
        try:
            truth = json.loads(Path(res).read_text())
        except (OSError, ValueError):
            truth = None
        Path(res).unlink(missing_ok=True)
        return rep, truth

    # ---- rows ---------------------------------------------------------------------------------
    def row(self, wl: str, what: str, printed, truth, tol: float | None, *, ok: bool | None = None,
            note: str = "") -> None:
        ratio = (printed / truth) if isinstance(printed, (int, float)) and isinstance(truth, (int, float)) \
            and truth else None
        if ok is None:
            ok = ratio is not None and tol is not None and abs(ratio - 1) <= tol
        self.rows.append({"workload": wl, "what": what, "printed": printed, "truth": truth,
                          "ratio": ratio, "tolerance": tol, "ok": bool(ok), "note": note})

    def probes_part(self, name: str) -> None:
        base = self.plain(name)
        self.raw.setdefault(name, {})["plain"] = base
        if base is None:
            self.row(name, "plain run", None, None, None, ok=False, note="the workload failed plainly")
            return
        for probe in self.a.probes.split(","):
            rep, truth = self.probe(name, probe)
            self.raw[name][probe] = {"truth": truth, "metrics": (rep or {}).get("metrics"),
                                     "findings": [(f["code"], f["severity"], f["title"])
                                                  for f in (rep or {}).get("findings", [])],
                                     "internal_errors": [f.get("evidence") for f in (rep or {}).get("findings", [])
                                                         if f["code"] == "internal-error"]}
            if rep is None or truth is None:
                self.row(name, f"{probe}: run", None, None, None, ok=False,
                         note="no report" if rep is None else "the workload wrote no result under the probe")
                continue
            m = rep.get("metrics") or {}
            st = m.get("steps") or {}
            # profile records steps 3-4 (--skip 2 --window 2) and counts FLOPs in a step after
            # them: all inside the workloads' warm-up, so the workload's timed window holds no
            # profiled step and is this run's truth as for the other probes
            ser = st.get("series") or {}
            lo, hi = truth["warmup"] + 1, truth["warmup"] + truth["steps"]
            win = [w for s_, w in zip(ser.get("step") or [], ser.get("wall_ms") or []) if lo <= s_ <= hi]
            if len(win) == truth["steps"] and probe != "profile":  # the same steps as the workload's window, per-step basis
                self.row(name, f"{probe}: step ms (its window's steps)", statistics.fmean(win),
                         truth["step_ms"], TOL_STEP, note=str(st.get("step_time_basis", "host wall")))
            # steps the probe's own measurement slowed, left out of its printed figures
            skipped = set(st.get("site_window_steps_skipped") or []) | set(st.get("profiler_window_steps_skipped") or [])
            inside = sorted(x for x in skipped if lo <= x <= hi)
            ref, refnote = truth, ""
            if inside:
                # the workload's window holds steps the memory site window slowed, which the printed
                # figures leave out: the truth for them is the workload's own window total less
                # those steps' times (from the series checked against the same total in the row
                # above); phase means are then not comparable (the workload's hold those steps)
                series = dict(zip(ser.get("step") or [], ser.get("wall_ms") or []))
                k = len(inside)
                slowed = sum(series.get(x, 0.0) for x in inside)
                rest = (truth["step_ms"] * truth["steps"] - slowed) / max(1, truth["steps"] - k)
                self.row(name, f"{probe}: run slowed over its window (site window)",
                         truth["step_ms"] / base["step_ms"], 1.0, None, ok=True,
                         note=f"steps {inside[0]}-{inside[-1]} under the memory site window took "
                              f"{slowed:.0f} ms; left out of the printed figures")
                ref = {"step_ms": rest, "steps": truth["steps"] - k, "phase_ms": {}}
                refnote = (f"informational: truth is the workload's window mean less its {k} "
                           "site-window steps, a mean against a median on a noisy host-bound loop; "
                           "the per-step series is checked on the same steps in the row above")
            if st.get("median_step_ms") is not None:
                self.row(name, f"{probe}: step ms (median, printed)", st["median_step_ms"],
                         ref["step_ms"], None if inside else TOL_STEP, ok=True if inside else None,
                         note=refnote)
            dev = st.get("device") or {}
            for ph in ("forward", "backward", "optimizer"):
                t = (ref.get("phase_ms") or {}).get(ph)
                v = dev.get(f"{ph}_ms")
                if ph == "forward" and st.get("forward_unseen"):
                    self.row(name, f"{probe}: forward device ms", "not seen", t, None, ok=True,
                             note="said so in the report (forward_unseen), not shown as 0")
                    continue
                if t is None or v is None or t < MIN_PHASE_SHARE * ref["step_ms"]:
                    continue
                if st.get("share_basis") == "host":
                    # a host-bound step: a phase's event span is the host's launch cadence, and the
                    # workload's optimizer events bracket opt.step() with torchdoctor's step-end
                    # hooks inside it; judged where the GPU is the bottleneck
                    self.row(name, f"{probe}: {ph} device ms", v, t, None, ok=True,
                             note="host-bound step: informational")
                    continue
                self.row(name, f"{probe}: {ph} device ms", v, t, TOL_PHASE)
            if st.get("share_basis"):
                top = max(st["share"], key=st["share"].get)
                tp = max(truth.get("phase_ms") or {"?": 0}, key=(truth.get("phase_ms") or {"?": 0}).get)
                dominant = top == tp or st.get("share_basis") == "host"
                self.row(name, f"{probe}: dominant phase ({st['share_basis']} basis)", top, tp, None,
                         ok=dominant, note=f"shares {st['share']}")
            mem = m.get("memory") or {}
            end = (mem.get("cuda_end") or {}).get("0") or {}
            if end.get("peak_allocated") and truth.get("max_memory_allocated"):
                self.row(name, f"{probe}: peak allocated", end["peak_allocated"],
                         truth["max_memory_allocated"], TOL_PEAK)
            a, b = truth.get("memory_at_step_end") or [], base.get("memory_at_step_end") or []
            if a and b:
                n = min(len(a), len(b))
                worst = max(abs(x - y) for x, y in zip(a[:n], b[:n]))
                self.row(name, f"{probe}: tool memory at step end (max |Δ| B)", worst, BLOCK, None,
                         ok=worst <= BLOCK, note=f"{n} steps vs the plain run")
            fl = m.get("flops") or {}
            if fl.get("status") == "ok" and fl.get("step_ms"):
                self.row(name, f"{probe}: FLOP-counter step ms", fl["step_ms"], truth["step_ms"], TOL_STEP,
                         note=f"mfu {fl.get('mfu')} of {fl.get('peak_dtype')} peak; dtype peak "
                              f"{fl.get('mfu_dtype_peak')}" + ("; SUSPECT" if fl.get("mfu_suspect") else ""))
            bad = [f"{c}@{s}" for c, s, _ in self.raw[name][probe]["findings"]
                   if c == "internal-error" or (c == "memory-growth" and s != "info")]
            self.row(name, f"{probe}: findings", ", ".join(f"{c}@{s}" for c, s, _ in
                                                           self.raw[name][probe]["findings"]) or "none",
                     None, None, ok=not bad, note="tool-induced finding: " + ", ".join(bad) if bad else "")

    def treat_part(self, name: str) -> None:
        trials = WORKLOADS[name][3]
        if not trials:
            return
        tries = [x for t in trials for x in ("--try", t)]
        cmd = [sys.executable, "-m", "torchdoctor", "treat", "--json", "--rounds", "2", "--steps",
               str(self.a.treat_steps), "--timeout", "300", *tries, *self.wargs(name)]
        p = self._run(cmd, 900)
        rep = None
        try:
            rep = json.loads(p.stdout) if p is not None else None
        except ValueError:
            pass
        # the same changes by hand, A/B in alternating rounds
        arms = [("plain", [])] + [(t, f) for t, f in trials.items()]
        times: dict[str, list[float]] = {k: [] for k, _ in arms}
        for r in range(self.a.ab_rounds):
            for k, flags in (arms if r % 2 == 0 else list(reversed(arms))):
                res = self.plain(name, flags)
                if res:
                    times[k].append(res["step_ms"])
        self.raw.setdefault(name, {})["treat"] = {"trials": (rep or {}).get("metrics", {}).get("trials"),
                                                  "findings": [(f["code"], f["severity"]) for f in
                                                               (rep or {}).get("findings", [])],
                                                  "ab_ms": times}
        if rep is None:
            self.row(name, "treat: run", None, None, None, ok=False, note="no report")
            return
        mem = [f"{f['code']}@{f['severity']}" for f in rep.get("findings", []) if f["code"] == "memory-growth"]
        self.row(name, "treat: baseline memory finding", ", ".join(mem) or "none", None, None, ok=not mem)
        base = times["plain"]
        for t in trials:
            e = next((x for x in (rep.get("metrics") or {}).get("trials") or []
                      if x["name"] == t.split("=")[0]), None)
            tt = times[t]
            if not base or not tt:
                self.row(name, f"treat {t}: A/B", None, None, None, ok=False, note="A/B runs failed")
                continue
            truth = statistics.median(base) / statistics.median(tt)
            noise = max(0.02, *[(max(v) - min(v)) / statistics.median(v) for v in (base, tt) if len(v) > 1])
            gain = truth >= 1 + noise
            if e is None:
                self.row(name, f"treat {t}: speed-up", None, truth, None, ok=False, note="no trial entry")
                continue
            v = e.get("verdict")
            note = f"verdict {v}: {e.get('reason')}; A/B noise ±{noise:.0%}"
            if v in ("failed", "skipped") or e.get("speedup") is None:
                self.row(name, f"treat {t}: speed-up", e.get("speedup"), truth, None, ok=v != "failed",
                         note=note)
                continue
            self.row(name, f"treat {t}: speed-up", e["speedup"], truth, TOL_SPEEDUP, note=note)
            if v == "adopt":
                self.row(name, f"treat {t}: adopt backed by A/B", round(truth, 3), round(1 + noise, 3),
                         None, ok=gain, note="adopt needs an A/B gain beyond noise")

    # ---- output -------------------------------------------------------------------------------
    def table(self) -> str:
        def f(x):
            if isinstance(x, float):
                return f"{x:.4g}"
            return str(x)[:40] if x is not None else "-"

        lines = [f"GPU truth: {machine()}", "",
                 f"{'workload':<12} {'what':<46} {'printed':>12} {'truth':>12} {'ratio':>7} {'tol':>5}  ok  note",
                 "-" * 140]
        for r in self.rows:
            ratio = "%.3f" % r["ratio"] if r["ratio"] else "-"
            tol = "±%d%%" % round(r["tolerance"] * 100) if r["tolerance"] else "-"
            ok = "ok" if r["ok"] else "FAIL"
            lines.append(f"{r['workload']:<12} {r['what']:<46} {f(r['printed']):>12} {f(r['truth']):>12} "
                         f"{ratio:>7} {tol:>5}  {ok:<4}  {r['note'][:90]}")
        bad = sum(not r["ok"] for r in self.rows)
        lines += ["", f"{len(self.rows)} rows, {bad} out of tolerance"]
        return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu-truth"))
    ap.add_argument("--parts", default="probes,treat")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--probes", default=",".join(PROBES))
    ap.add_argument("--ab-rounds", type=int, default=2)
    ap.add_argument("--treat-steps", type=int, default=16)
    a = ap.parse_args()
    h = Harness(a)
    t0 = time.monotonic()
    for name in a.workloads.split(","):
        for part in a.parts.split(","):
            try:
                getattr(h, f"{part}_part")(name)
            except Exception as e:  # noqa: BLE001 - one broken workload must not lose the table
                h.row(name, f"{part}: harness", None, None, None, ok=False, note=f"{type(e).__name__}: {e}")
            (h.out / "gpu_truth.json").write_text(json.dumps({"machine": machine(), "rows": h.rows,
                                                               "raw": h.raw}, indent=1, default=str))
            print(f"[{time.monotonic() - t0:.0f} s] {name} {part} done", file=sys.stderr, flush=True)
    text = h.table() + f"\n(wall {time.monotonic() - t0:.0f} s)"
    (h.out / "gpu_truth.txt").write_text(text + "\n")
    print(text)
    return 1 if any(not r["ok"] for r in h.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
