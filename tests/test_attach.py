"""`torchdoctor attach` on real running jobs: 2 gloo ranks started plainly with torchrun.

- a job where rank 1 is slow (named as slow, not stuck), then skips an all_reduce: the finding
  names both lines; the job is still running after the attach (it is hung by design: the test
  ends it);
- a healthy job: no warning, and it finishes with exit 0 and its own check "ok" on both ranks;
- bad PIDs: exit 2 with one line, never a traceback.
Skipped (with the reason) where ptrace is not permitted or py-spy is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from torchdoctor.attach.sampler import dump, find_pyspy

FIXTURES = Path(__file__).parent / "fixtures" / "attach"
START_TIMEOUT_S = 180  # torchrun + 2 × import torch on a loaded 2-core box


@pytest.fixture(scope="module")
def pyspy():
    binary = find_pyspy()
    if binary is None:
        pytest.skip("py-spy is not installed")
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        d = dump(binary, p.pid, timeout=30)
    finally:
        p.kill()
        p.wait()
    if "error" in d and d["kind"] == "permission":
        pytest.skip(f"ptrace is not permitted here: {d['error'][:200]}")
    assert "threads" in d, d
    return binary


class Job:
    """torchrun --standalone --nproc-per-node 2 SCRIPT, its output collected line by line."""

    def __init__(self, script: str, env: dict | None = None) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
             str(FIXTURES / script)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, *texts: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if all(any(t in line for line in self.lines) for t in texts):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.kill()
        pytest.fail(f"job did not print {texts}: {self.lines[-20:]}")

    def kill(self) -> None:
        kill_tree(self.proc)


def kill_tree(proc: subprocess.Popen) -> None:
    """End a job this test started: torchrun's ranks run in sessions of their own, so killing
    torchrun's process group would leave hung ranks behind; each descendant is ended by its PID."""
    import psutil

    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    for k in kids:
        try:
            k.kill()
        except psutil.NoSuchProcess:
            pass
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)
    psutil.wait_procs(kids, timeout=30)


def attach(*args: str) -> tuple[int, dict | None, str]:
    p = subprocess.run([sys.executable, "-m", "torchdoctor", "attach", *args, "--json"],
                       capture_output=True, text=True, timeout=240)
    try:
        rep = json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        rep = None
    return p.returncode, rep, p.stderr


def line_of(script: str, text: str) -> int:
    src = (FIXTURES / script).read_text().splitlines()
    return next(i for i, line in enumerate(src, 1) if text in line)


@pytest.mark.slow
def test_a_slow_rank_then_a_skipped_all_reduce_are_named_with_their_lines(pyspy, tmp_path):
    """One job, two attaches: while rank 1 decodes slowly the job is slow, not stuck (rank 1 named,
    moving); after rank 1 skips the gradient all_reduce, both lines are named. One torchrun start
    serves both (CI time)."""
    stop = tmp_path / "stop"
    job = Job("skip_allreduce.py", {"STOP_FILE": str(stop)})
    src = "skip_allreduce.py"
    try:
        job.wait_for("rank 0 training", "rank 1 training")
        time.sleep(2)
        code, rep, err = attach("--job", str(job.proc.pid), "--duration", "3")
        assert rep is not None, err
        found = {f["code"]: f for f in rep["findings"]}
        assert code == 0 and list(found) == ["rank-waited-for"], (rep["findings"], rep["metrics"]["attach"]["where"])
        title = found["rank-waited-for"]["title"]
        assert title.startswith("rank 1 is slow, not stuck: rank 0 waits in a collective in all 5 samples")
        assert "rank 1 runs decode at skip_allreduce.py:" in title and "in a collective" in title, title
        assert "all_reduce at skip_allreduce.py:" in title, title

        stop.write_text("the data ran out\n")
        job.wait_for("rank 1 skips the all_reduce")  # rank 1 finished its slow step
        time.sleep(1)  # both reach the place where they hang (rank 1 its barrier, rank 0 the all_reduce)
        code, rep, err = attach("--job", str(job.proc.pid), "--duration", "3")
        assert rep is not None, err
        found = {f["code"]: f for f in rep["findings"]}
        assert code == 1 and "collective-mismatch" in found, (code, rep["findings"], rep["metrics"])
        title = found["collective-mismatch"]["title"]
        assert f"rank 0 waits in all_reduce at {src}:{line_of(src, 'dist.all_reduce(g)')}" in title, title
        assert f"rank 1 waits in barrier at {src}:{line_of(src, 'dist.barrier()')}" in title, title
        assert job.proc.poll() is None, "the attach must leave the job running"
    finally:
        job.kill()


@pytest.mark.slow
def test_a_rank_spinning_in_python_while_the_other_waits_is_named(pyspy):
    """Rank 1 polls a flag nothing sets (pure Python, its stack moves between the loop's lines)
    while rank 0 waits in the next all_reduce: rank-spinning, not a slow rank."""
    src = "spin_rank.py"
    job = Job(src)
    try:
        job.wait_for("rank 1 polling")
        # rank 0 must stay asleep >= MIN_QUIET_S (5 s) between dumps: a shorter window cannot
        # tell a livelock from one long step
        code, rep, err = attach("--job", str(job.proc.pid), "--duration", "7")
        assert rep is not None, err
        found = {f["code"]: f for f in rep["findings"]}
        assert code == 1 and list(found) == ["rank-spinning"], (rep["findings"], rep["metrics"]["attach"])
        title = found["rank-spinning"]["title"]
        assert title.startswith("rank 1 spins in Python while the others wait: rank 0 waits in "
                                f"all_reduce at {src}:{line_of(src, 'dist.all_reduce(g)')}"), title
        assert "its main thread not woken once in" in title and "rank 1 runs poll_ready" in title, title
        procs = {p["rank"]: p for p in rep["metrics"]["attach"]["processes"]}
        assert procs[0]["main_wakes"] == 0 and procs[1]["main_wakes"] > 0, procs
        assert job.proc.poll() is None, "the attach must leave the job running"
    finally:
        job.kill()


@pytest.mark.slow
def test_a_healthy_job_raises_no_warning_and_finishes_as_it_would(pyspy):
    job = Job("healthy.py", {"STEPS": "400"})
    try:
        job.wait_for("rank 0 training", "rank 1 training")
        code, rep, err = attach("--job", str(job.proc.pid), "--duration", "2")
        assert rep is not None, err
        assert code == 0 and [f for f in rep["findings"] if f["severity"] != "info"] == [], rep["findings"]
        procs = rep["metrics"]["attach"]["processes"]
        assert sorted(p["rank"] for p in procs if p["role"] == "rank") == [0, 1]
        assert all(p["samples"] >= 3 for p in procs if p["role"] == "rank"), procs
        fr = rep["metrics"]["attach"]["flight_recorder"]
        assert fr["state"] == "not-enabled" and "TORCH_NCCL_TRACE_BUFFER_SIZE" in fr["how"]
        assert job.proc.wait(timeout=180) == 0, job.lines[-20:]
        assert any("rank 0 ok" in line for line in job.lines) and any("rank 1 ok" in line for line in job.lines)
    finally:
        job.kill()


def start_plain(script: str, env: dict) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, str(FIXTURES / script)], stdout=subprocess.PIPE, text=True,
                         start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    return p


@pytest.fixture(scope="module")
def healthy_twin(pyspy):
    """healthy_twin.py (gil_thread.py's and leak_steps.py's loops with SICK unset, in one process)
    attached for leak_steps's default 10 s window, run to its end, beside the same run never
    attached: what the two tests of those fixtures check of their healthy twin, from one run."""
    healthy = start_plain("healthy_twin.py", {"STEPS": "300"})
    unattached = start_plain("healthy_twin.py", {"STEPS": "300"})  # the same run, never attached
    try:
        assert healthy.stdout.readline().strip() == "training"
        code, rep, err = attach(str(healthy.pid), "--duration", "10")
        assert rep is not None, err
        out, _ = healthy.communicate(timeout=300)
        plain, _ = unattached.communicate(timeout=300)
        return {"code": code, "findings": rep["findings"],
                "warnings": [f for f in rep["findings"] if f["severity"] != "info"],
                "processes": rep["metrics"]["attach"]["processes"], "returncode": healthy.returncode,
                "unattached_returncode": unattached.returncode, "out": out, "plain": plain}
    finally:
        kill_tree(healthy)
        kill_tree(unattached)


@pytest.mark.slow
def test_a_thread_holding_the_gil_is_named_and_a_light_monitor_thread_is_not(pyspy, healthy_twin):
    """gil_thread.py: SICK=1, its statistics thread loops in pure Python (measured: it held the
    GIL in 86% of 150 samples); unset, it summarises a little once a second (2%): no finding, and
    the run finishes with exit 0 (the unset twin: `healthy_twin`)."""
    sick = start_plain("gil_thread.py", {"SICK": "1"})
    try:
        assert sick.stdout.readline().strip() == "training"
        code, rep, err = attach(str(sick.pid), "--duration", "3")
        assert rep is not None, err
        found = [f for f in rep["findings"] if f["code"] == "gil-held-by-thread"]
        line = line_of("gil_thread.py", "total += (x * i) % 7.0")
        assert code == 0 and len(found) == 1, rep["findings"]
        assert found[0]["title"].startswith(f"pid {sick.pid}: thread 'stats' (tid "), found[0]["title"]
        assert "summarise at gil_thread.py:" in found[0]["title"], found[0]["title"]
        assert found[0]["evidence"]["where"] in (f"summarise at gil_thread.py:{line}",
                                                 f"summarise at gil_thread.py:{line - 1}")
        assert sick.poll() is None
    finally:
        kill_tree(sick)
    healthy = healthy_twin
    assert healthy["code"] == 0 and healthy["warnings"] == [], healthy["findings"]
    gil = healthy["processes"][0]["gil"]
    assert gil["rate_hz"] == 50 and gil["threads"], gil  # measured, not skipped
    assert healthy["returncode"] == 0 and healthy["out"].startswith("done "), healthy["out"]


@pytest.mark.slow
def test_a_process_keeping_every_batch_is_named_and_its_bounded_twin_is_not(pyspy, healthy_twin):
    """leak_steps.py: SICK=1 keeps every step's 256 KiB batch (measured 3.8 MiB/s over the default
    10 s window); unset, it keeps the last 8: no finding, and it finishes with exit 0 and the output
    of the same run never attached (the unset twin: `healthy_twin`)."""
    sick = start_plain("leak_steps.py", {"SICK": "1"})
    try:
        assert sick.stdout.readline().strip() == "training"
        code, rep, err = attach(str(sick.pid), "--duration", "10")
        assert rep is not None, err
        found = [f for f in rep["findings"] if f["code"] == "live-memory-growth"]
        assert code == 0 and len(found) == 1, (rep["findings"], rep["metrics"]["attach"]["processes"])
        assert found[0]["title"].startswith(f"pid {sick.pid}: resident memory grows "), found[0]["title"]
        rate = found[0]["evidence"]["bytes_per_s"] / 2**20
        assert 1.5 < rate < 8, rate  # 256 KiB per step of 60 ms and a little more on a busy box
        assert sick.poll() is None
    finally:
        kill_tree(sick)
    healthy = healthy_twin
    assert healthy["code"] == 0 and healthy["warnings"] == [], healthy["findings"]
    assert healthy["processes"][0]["rss_samples"] >= 8
    assert healthy["returncode"] == 0 == healthy["unattached_returncode"], healthy
    assert healthy["out"].startswith("done "), healthy["out"]
    assert "training\n" + healthy["out"] == healthy["plain"], healthy  # the same output as without the attach


@pytest.mark.gpu
def test_a_host_waiting_in_item_on_an_idle_gpu_is_a_stall_and_a_busy_twin_is_not(pyspy):
    """host_sync_stall.py (CUDA): SICK=1 blocks its stream with a host function, so loss.item()
    waits forever on an idle GPU: host-sync-stall names the line. Unset, the same loop keeps the GPU
    busy (its main thread is at the same .item() line in most samples): nothing, exit 0."""
    src = "host_sync_stall.py"
    sick = start_plain(src, {"SICK": "1"})
    try:
        assert sick.stdout.readline().strip() == "training"
        assert sick.stdout.readline().strip() == "stalling"
        time.sleep(2)  # the queued kernels drain up to the host function
        code, rep, err = attach(str(sick.pid), "--duration", "5")
        assert rep is not None, err
        att = rep["metrics"]["attach"]
        assert att["nvml"], att["nvml_reason"]
        proc = att["processes"][0]
        if "gpu_util_max" not in proc:
            pytest.skip(f"NVML does not list PID {sick.pid} among the GPU's processes (a PID "
                        f"namespace of a container): {proc}")
        found = [f for f in rep["findings"] if f["code"] == "host-sync-stall"]
        line = line_of(src, "loss = y.square().mean().item()")
        assert code == 1 and len(found) == 1, (rep["findings"], att["where"], proc)
        assert f"waits for the GPU in item() at {src}:{line}" in found[0]["title"], found[0]["title"]
        assert proc["gpu_util_max"] <= 10, proc
        assert sick.poll() is None
    finally:
        kill_tree(sick)
    healthy = start_plain(src, {"RUN_S": "40"})
    try:
        assert healthy.stdout.readline().strip() == "training"
        code, rep, err = attach(str(healthy.pid), "--duration", "5")
        assert rep is not None, err
        assert code == 0 and [f for f in rep["findings"] if f["severity"] != "info"] == [], rep["findings"]
        out, _ = healthy.communicate(timeout=300)
        assert healthy.returncode == 0 and out.startswith("done "), out
    finally:
        kill_tree(healthy)


@pytest.mark.multigpu
def test_a_two_gpu_nccl_job_hung_in_a_collective_is_named_from_the_flight_recorder(pyspy, tmp_path):
    """nccl_hang.py on 2 GPUs, started plainly with the Flight Recorder's pipe: rank 1 skips an
    all_reduce, rank 0 waits for it in synchronize(). attach reads both ranks' recorder through their
    pipes (rank 0: the all_reduce pending one past rank 1's last), names the hang, and NVML shows
    rank 1's GPU idle. The job is then ended by the test, every rank by its PID. With OUT set, the
    report is kept as $OUT/attach_nccl_hang.json (rank 0's GPU utilisation is recorded there, not
    asserted: a waiting NCCL kernel may spin)."""
    import psutil

    src = "nccl_hang.py"
    trace = str(tmp_path / "trace_rank_")
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000",
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "fr_"),
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": trace, "TORCH_FR_DUMP_TEMP_FILE": trace,
           "STOP_FILE": str(tmp_path / "stop"), "TIMEOUT_S": "600"}
    job = Job(src, env)
    pids: list[int] = []
    try:
        job.wait_for("rank 0 hung", "rank 1 hung")
        time.sleep(3)  # rank 0 reaches synchronize(); the watchdogs see the warm steps completed
        code, rep, err = attach("--job", str(job.proc.pid), "--duration", "5")
        if rep is not None and os.environ.get("OUT"):
            Path(os.environ["OUT"], "attach_nccl_hang.json").write_text(json.dumps(rep, indent=1))
        assert rep is not None, (code, err, job.lines[-20:])
        att = rep["metrics"]["attach"]
        pids = [p["pid"] for p in att["processes"] if p["role"] == "rank"]
        assert job.proc.poll() is None, "the attach must leave the job running"
        fr = att["flight_recorder"]
        assert fr["state"] == "read", (fr, sorted(os.listdir(tmp_path)))
        r0, r1 = fr["ranks"]["0"], fr["ranks"]["1"]
        assert "error" not in r0 and "error" not in r1, (fr, sorted(os.listdir(tmp_path)))
        assert r0["first_pending"] and "all_reduce" in r0["first_pending"]["op"], r0
        assert r1["first_pending"] is None and r1["last_completed"], r1
        assert r0["first_pending"]["seq"] == r1["last_completed"]["seq"] + 1, fr
        assert r0["last_completed"]["seq"] == r1["last_completed"]["seq"], fr
        found = {f["code"]: f for f in rep["findings"]}
        assert code == 1 and "collective-hang" in found, (rep["findings"], att["where"])
        title = found["collective-hang"]["title"]
        seq = r0["first_pending"]["seq"]
        assert title.startswith(f"rank 0 waits in {r0['first_pending']['op']} seq {seq} "), title
        assert f"rank 1 never called seq {seq}" in title, title
        assert f"rank 1 runs main at {src}:{line_of(src, 'time.sleep(0.1)')}" in title, title
        assert att["nvml"], att["nvml_reason"]
        procs = {p["rank"]: p for p in att["processes"] if p["role"] == "rank"}
        if "gpu_util_max" not in procs[1]:
            pytest.skip(f"NVML does not list the ranks' PIDs (a container's PID namespace): {procs}")
        assert procs[1]["gpu_util_max"] <= 10, procs[1]  # rank 1 launched nothing: its GPU idles
        assert "gpu_util_max" in procs[0], procs[0]
    finally:
        job.kill()

        def running(pid: int) -> bool:
            try:
                return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False

        left = [p for p in pids if running(p)]
        assert not left, f"ranks still running after the test ended the job: {left}"


@pytest.mark.slow
def test_a_dataloader_worker_blocked_forever_is_named(pyspy):
    p = subprocess.Popen([sys.executable, str(FIXTURES / "stuck_worker.py")], stdout=subprocess.PIPE,
                         text=True, start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert p.stdout.readline().strip() == "training"
        time.sleep(3)  # the worker reaches its blocking sample
        code, rep, err = attach(str(p.pid), "--duration", "2")
        assert rep is not None, err
        f = [f for f in rep["findings"] if f["code"] == "dataloader-worker-stuck"]
        line = line_of("stuck_worker.py", "threading.Event().wait()")
        assert f and f"Shards.__getitem__ at stuck_worker.py:{line}" in f[0]["title"], rep["findings"]
        assert p.poll() is None
    finally:
        kill_tree(p)


@pytest.mark.slow
def test_an_interrupted_attach_ends_its_gil_record_at_once(pyspy, tmp_path):
    from torchdoctor.attach.sampler import GilRecord

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        time.sleep(0.5)
        rec = GilRecord(pyspy, p.pid, 60, str(tmp_path))
        time.sleep(1)
        t0 = time.monotonic()
        rec.stop()
        assert time.monotonic() - t0 < 5 and rec.proc.poll() is not None
        assert p.poll() is None  # the target is untouched
    finally:
        p.kill()
        p.wait()


def test_bad_targets_are_exit_2_with_one_line(pyspy):
    plain = subprocess.Popen(["sleep", "60"])  # a process, but not a torchrun launcher nor Python
    try:
        for args, says in ((["999999999"], "no process with PID 999999999"),
                           (["--job", str(plain.pid)], "not a torchrun launcher or rank"),
                           ([str(plain.pid), "--duration", "1"], "not a Python process"),
                           ([], "give the PIDs")):
            code, rep, err = attach(*args)
            assert code == 2 and says in err and "Traceback" not in err, (args, err)
        assert plain.poll() is None  # never signalled
    finally:
        plain.kill()
        plain.wait()
