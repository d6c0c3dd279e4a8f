"""Parent side of the collective self-test: launch torchrun, bound it, merge the rank files.

``run_selftest`` starts ``python -m torch.distributed.run --standalone --nproc-per-node N
-m torchdoctor.distributed.selftest_worker`` in a new process group (bound to us: it dies with
torchdoctor, :mod:`torchdoctor.runner.lifeline`), waits at most ``timeout_s`` seconds, kills
the whole group on timeout or on a stop signal (Ctrl-C, SIGTERM, SIGHUP: SIGTERM, then
SIGKILL), then every process of the run by session and parent tree, and merges
``rank{R}.json`` into one dict (see :func:`merge`). It measures; it does not judge.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import torchdoctor
from torchdoctor.distributed.procs import live_cmdline
from torchdoctor.runner import lifeline, reap, signals
from torchdoctor.distributed.busbw import allreduce_bandwidth, median

MiB = 1 << 20
GPU_SIZES = [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
CPU_SIZES = [64 << 10, 1 * MiB, 4 * MiB]

# Never let anything we launch on GPUs use NVLink multicast (NVLS / symmetric memory):
# on shared boxes it has taken GPUs down (task brief); the self-test does not need it.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
# Launch variables torchrun --standalone sets itself; stale values from the caller's
# shell would only confuse it (the env audit judges them separately).
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of torchrun and its workers: the caller's, minus stale launch
    variables, plus SAFE_ENV, OMP_NUM_THREADS=1 unless set, and torchdoctor importable."""
    env = dict(os.environ if base is None else base)
    for k in list(env):
        if k in LAUNCH_VARS or k.startswith("TORCHELASTIC_"):
            del env[k]
    env.update(SAFE_ENV)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    root = str(Path(torchdoctor.__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def torchrun_cmd(nproc: int, out_dir: Path, backend: str, sizes: list[int], pg_timeout: float,
                 watchdog: float, warmup: int, reps: int, node=None) -> list[str]:
    where = node.torchrun_args() if node is not None else ["--standalone"]
    return [sys.executable, "-m", "torch.distributed.run", *where,
            f"--nproc-per-node={nproc}", "--max-restarts=0", "--monitor-interval=0.1",
            "-m", "torchdoctor.distributed.selftest_worker", "--out", str(out_dir),
            "--backend", backend, "--sizes", ",".join(map(str, sizes)),
            "--warmup", str(warmup), "--reps", str(reps),
            "--pg-timeout", f"{pg_timeout:g}", "--watchdog", f"{watchdog:g}"]


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> bool:
    """SIGTERM the process group, SIGKILL what is left after ``grace_s``; True if it is gone."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        if not group_alive(pgid):
            break
        time.sleep(0.2)
    try:
        proc.wait(timeout=1)
    except subprocess.TimeoutExpired:
        pass
    return not group_alive(pgid)


def kill_workers(out: Path) -> bool:
    """SIGKILL any self-test worker of this run (pid from its rank file) still alive; True if none left."""
    pids = []
    for p in out.glob("rank*.json"):
        try:
            pids.append(int(json.loads(p.read_text())["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    left = []
    for pid in pids:
        if is_our_worker(pid, out):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            left.append(pid)
    deadline = time.monotonic() + 5.0
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if is_our_worker(pid, out)]
        if left:
            time.sleep(0.05)
    return not left


def is_our_worker(pid: int, out: Path) -> bool:
    """pid is alive (not a zombie) and runs selftest_worker on ``out``."""
    args = live_cmdline(pid)
    return args is not None and "torchdoctor.distributed.selftest_worker" in args and str(out) in args


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_selftest(nproc: int, out_dir: str | Path, backend: str = "auto", sizes: list[int] | None = None,
                 timeout_s: float = 180.0, warmup: int | None = None, reps: int | None = None,
                 env: dict[str, str] | None = None, node=None) -> dict:
    """Run the self-test on ``nproc`` local ranks; returns :func:`merge`'s dict.

    ``node`` (a :class:`~torchdoctor.distributed.multinode.NodeSpec`): this node's part of a
    multi-node self-test (:mod:`torchdoctor.distributed.selftest_nodes`).

    ``backend`` is "nccl", "gloo" or "auto" (nccl when CUDA is available in the workers).
    ``sizes`` are all-reduce sizes in bytes (default GPU_SIZES for nccl, CPU_SIZES for gloo).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.json"):
        old.unlink()
    gpu = backend == "nccl"
    sizes = list(sizes if sizes is not None else (GPU_SIZES if gpu else CPU_SIZES))
    warmup = warmup if warmup is not None else (5 if gpu else 1)
    reps = reps if reps is not None else (5 if gpu else 3)
    # The ranks' own process-group timeout ends a hung collective before we kill them;
    # their stack dump fires a little earlier still, so it lands before any kill.
    pg_timeout = max(5.0, timeout_s - 10.0)
    watchdog = max(3.0, timeout_s - 5.0)
    cmd = lifeline.bound_command(
        torchrun_cmd(nproc, out, backend, sizes, pg_timeout, watchdog, warmup, reps, node))
    run_env = child_env(env)
    if node is not None:
        from torchdoctor.distributed.rankdir import NODE_ENV

        run_env[NODE_ENV] = str(node.node_rank)
        if backend == "nccl" and "NCCL_DEBUG" not in run_env:  # the transport NCCL chose
            run_env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET")
    log_path = out / "torchrun.log"
    t0 = time.perf_counter()
    timed_out = False
    interrupted = None
    run_id = uuid.uuid4().hex  # marks every process of this self-test (reap.Tracker)
    with open(log_path, "w") as log, signals.catching() as pending:
        reap.become_subreaper()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**run_env, reap.RUN_ID_ENV: run_id},
                                start_new_session=True)
        tracker = reap.Tracker(proc.pid, adopt_after=time.monotonic(), marker=run_id)
        rc, timed_out, interrupted = _wait(proc, tracker, pending, timeout_s)
        # Workers may outlive torchrun's exit (or we timed out, or were stopped): end the group
        # gently first (torchrun's handler stops its ranks), then everything of the run.
        gone = kill_group(proc, grace_s=2.0 if interrupted else 5.0) \
            if (timed_out or interrupted or group_alive(proc.pid)) else True
        if rc is None:
            rc = proc.returncode
        # torchrun starts each worker in its own session (start_new_session=True), so the
        # group kill above does not reach a worker whose agent died first: end those by pid,
        # then by session and parent tree (their own subprocesses too).
        gone = kill_workers(out) and gone
        gone = not tracker.kill_all() and gone
        reap.become_subreaper(False)
    wall = time.perf_counter() - t0
    ranks = read_ranks(out)
    if node is not None:
        from torchdoctor.distributed import selftest_nodes as sn

        job = sn.read_job(out)  # every rank of the job, shared in-band at the end
        if job:
            mine = {r.get("rank") for r in ranks}
            ranks = sorted(ranks + [r for r in job if r.get("rank") not in mine],
                           key=lambda r: r.get("rank", 0))
    merged = merge(ranks, nproc=nproc, backend=backend, sizes=sizes)
    if node is not None:
        merged["nodes"] = sn.node_bandwidth(ranks)
        merged["transport"] = sn.transports(tail(log_path, 200_000))
        merged["node_rank"], merged["nnodes"] = node.node_rank, node.nnodes
    merged.update(returncode=rc, timed_out=timed_out, timeout_s=timeout_s, wall_s=round(wall, 3),
                  processes_left=not gone, log=str(log_path), log_tail=tail(log_path))
    if interrupted:
        merged["interrupted_by"] = interrupted
    merged["status"] = status_of(merged)
    (out / "selftest.json").write_text(json.dumps(merged, indent=1))
    return merged


def _wait(proc: subprocess.Popen, tracker: reap.Tracker, pending: signals.Pending,
          timeout_s: float) -> tuple[int | None, bool, str | None]:
    """(return code or None, timed out, the stop signal's name or None), polling every 0.1 s."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            rc = proc.poll()
            if rc is not None:
                return rc, False, None
            got = pending.take()
            if got:
                return None, False, signals.name(got[0])
            if time.monotonic() >= deadline:
                return None, True, None
            tracker.maybe_snapshot()
            time.sleep(0.1)
        except KeyboardInterrupt:  # handlers could not be set (not the main thread)
            return None, False, "SIGINT"


def read_ranks(out: Path) -> list[dict]:
    ranks = []
    for p in sorted(out.glob("rank*.json"), key=lambda p: p.name):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        stack = out / f"rank{data.get('rank')}.stack.txt"
        if stack.is_file() and stack.stat().st_size:
            data["stack"] = stack.read_text()[-4000:]
        ranks.append(data)
    return sorted(ranks, key=lambda r: r.get("rank", 0))


def tail(path: Path, n_chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n_chars:]
    except OSError:
        return ""


def merge(ranks: list[dict], nproc: int, backend: str, sizes: list[int]) -> dict:
    """Merge rank records into one self-test result.

    - ``checks``: per op, ok only when every rank reported ok; ``failed_ranks`` lists the rest;
    - ``sweep``: per size, time_s = mean over ranks of each rank's median repetition (the
      nccl-tests default averages over ranks), algbw/busbw in GB/s (1e9 bytes/s);
    - ``ranks``: rank, phase, device, error (short) per rank.
    """
    world = max((r.get("world_size", 0) for r in ranks), default=nproc) or nproc
    backends = {r.get("backend") for r in ranks if r.get("backend")}
    out: dict = {"nproc": nproc, "world_size": world,
                 "backend": backends.pop() if len(backends) == 1 else backend,
                 "ranks_reported": len(ranks), "sizes": sizes}
    out["ranks"] = [{"rank": r.get("rank"), "phase": r.get("phase"), "device": r.get("device"),
                     "host": r.get("host"), "init_s": r.get("init_s"),
                     "error": last_line(r.get("error")), "error_full": r.get("error"),
                     "stack": r.get("stack")} for r in ranks]
    checks: dict[str, dict] = {}
    for r in ranks:
        for c in r.get("checks", []):
            e = checks.setdefault(c["op"], {"op": c["op"], "ok": True, "max_abs_err": 0.0,
                                            "failed_ranks": [], "error": None, "ranks": 0})
            e["ranks"] += 1
            if c.get("max_abs_err") is not None:
                e["max_abs_err"] = max(e["max_abs_err"], c["max_abs_err"])
            if not c.get("ok"):
                e["ok"] = False
                e["failed_ranks"].append(r.get("rank"))
                e["error"] = e["error"] or c.get("error")
    for e in checks.values():
        if e["ranks"] < world:  # a rank never got there: not verified
            e["ok"] = False
    out["checks"] = list(checks.values())
    per_size: dict[int, list[float]] = {}
    iters: dict[int, int] = {}
    for r in ranks:
        for row in r.get("sweep", []):
            if row.get("rep_s"):
                per_size.setdefault(row["bytes"], []).append(median(row["rep_s"]))
                iters[row["bytes"]] = row.get("iters", 0)
    sweep = []
    for nbytes in sorted(per_size):
        times = per_size[nbytes]
        if len(times) < world:
            continue  # incomplete: some rank did not finish this size
        t = sum(times) / len(times)
        algbw, busbw = allreduce_bandwidth(nbytes, t, world)
        sweep.append({"bytes": nbytes, "time_us": round(t * 1e6, 2), "algbw_gbs": round(algbw, 3),
                      "busbw_gbs": round(busbw, 3), "iters": iters.get(nbytes),
                      "rank_time_us": [round(x * 1e6, 2) for x in times]})
    out["sweep"] = sweep
    return out


def last_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:500] if lines else None


def status_of(m: dict) -> str:
    """ok | interrupted | timeout | failed (a rank crashed or torchrun failed) | wrong (a check
    gave bad values)."""
    if m.get("interrupted_by"):
        return "interrupted"
    if m.get("timed_out"):
        return "timeout"
    if any(r.get("error") for r in m["ranks"]) or m.get("returncode") not in (0, None) \
            or m["ranks_reported"] < m["world_size"]:
        return "failed"
    if any(not c["ok"] for c in m["checks"]) or len(m["checks"]) == 0:
        return "wrong" if m["checks"] else "failed"
    return "ok"
