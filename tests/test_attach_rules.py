"""The attach rules on synthetic evidence (no process, no py-spy): where, stuck vs moving, the
finding each situation raises, and silence on a healthy job."""

from __future__ import annotations

from torchdoctor.attach import flight
from torchdoctor.attach.report import build_report
from torchdoctor.attach.sampler import classify_error, parse_dump
from torchdoctor.attach.views import place_of, views

TORCH = "/venv/lib/python3.11/site-packages/torch"
C10D = f"{TORCH}/distributed/distributed_c10d.py"
DL = f"{TORCH}/utils/data/dataloader.py"


def fr(file, line, name):
    return {"file": file, "line": line, "name": name}


def collective(op, user_line, file="/job/train.py"):
    return [fr(C10D, 2800, op), fr(f"{TORCH}/distributed/c10d_logger.py", 81, "wrapper"),
            fr(file, user_line, "train_epoch"), fr(file, 30, "main"), fr(file, 40, "<module>")]


def code(line, name="load_batch", file="/job/train.py"):
    return [fr(file, line, name), fr(file, 30, "main"), fr(file, 40, "<module>")]


def proc(pid, rank, stacks, role="rank", parent=None, status="sleeping", wakes=None, cpu_ns=0, every=2.5):
    """``wakes``: the main thread's switches between consecutive dumps (each dump adds 2 of its
    own, as measured on a thread blocked in a futex); None: no counters read."""
    samples = [{"t": 100.0 + every * i, "read_s": 0.25,
                "threads": [{"tid": pid, "name": "MainThread", "active": False,
                             "gil": False, "frames": s}]}
               for i, s in enumerate(stacks)]
    if wakes is not None:
        n = 0
        for i, s in enumerate(samples):
            n += wakes if i else 0
            s["main_before"] = {"switches": n, "cpu_ns": cpu_ns * i}
            n += 2
            s["main_after"] = {"switches": n, "cpu_ns": cpu_ns * i + 10_000}
    return {"pid": pid, "rank": rank, "role": role, "parent": parent, "samples": samples, "status": status}


def ev(*procs, fr_state=None):
    return {"duration_s": 10, "stack_samples": 5, "processes": list(procs),
            "sampler": {"tool": "py-spy", "version": "0.4.3", "blocking": True},
            "resources": {"series": []},
            "flight_recorder": fr_state or {"state": "not-enabled", "how": flight.HOW_TO_ENABLE}}


def codes(e):
    return sorted(f"{f.code}@{f.severity}" for f in build_report(e, "test").findings)


def test_place_names_the_collective_and_the_users_line():
    p = place_of(collective("all_reduce", 17))
    assert (p.kind, p.op, p.at, p.function) == ("collective", "all_reduce", "train.py:17", "train_epoch")
    assert place_of(code(71)).kind == "code"
    # --native: shared-object frames (line 0) are never the user's place
    native = [fr("/usr/lib/x86_64-linux-gnu/libc.so.6", 0, "clock_nanosleep"),
              fr("/usr/lib/libpython3.11.so.1.0", 0, "time_sleep"), *code(71)]
    assert place_of(native).at == "train.py:71"


def test_one_rank_elsewhere_is_the_rank_waited_for_with_both_lines():
    e = ev(proc(10, 0, [collective("all_reduce", 17)] * 5), proc(11, 1, [code(71)] * 5))
    rep = build_report(e, "t")
    assert codes(e) == ["collective-hang@error"]
    title = rep.findings[0].title
    assert "rank 0 waits in all_reduce at train.py:17" in title and "load_batch at train.py:71" in title
    assert "unchanged for 10.0 s" in title


def test_a_moving_rank_is_slow_not_stuck():
    moving = [code(60 + i) for i in range(5)]
    e = ev(proc(10, 0, [collective("all_reduce", 17)] * 5), proc(11, 1, moving))
    rep = build_report(e, "t")
    assert codes(e) == ["rank-waited-for@warning"]
    assert rep.findings[0].title.startswith("rank 1 is slow, not stuck: rank 0 waits in a collective in all 5 ")
    # the waiting rank need not show one stack: it waits in the next step's collectives too
    waits = [collective("all_reduce", 17), collective("all_reduce", 27)] * 2 + [collective("all_reduce", 17)]
    e = ev(proc(10, 0, waits), proc(11, 1, moving))
    assert codes(e) == ["rank-waited-for@warning"]
    caught = waits[:4] + [code(5, "step")]  # ... but in a collective in every sample
    assert codes(ev(proc(10, 0, caught), proc(11, 1, moving))) == []
    # a slow rank caught once passing through the collective it makes the others wait in
    once = [collective("all_reduce", 17)] + moving[1:]
    assert codes(ev(proc(10, 0, waits), proc(11, 1, once))) == ["rank-waited-for@warning"]


def test_a_rank_moving_in_python_while_the_others_never_wake_is_spinning():
    moving = [code(60 + i % 3, "poll_ready") for i in range(5)]
    asleep = proc(10, 0, [collective("all_reduce", 17)] * 5, wakes=0)  # 2 wakes in each dump
    e = ev(asleep, proc(11, 1, moving, wakes=40, cpu_ns=2_400_000_000))
    rep = build_report(e, "t")
    assert codes(e) == ["rank-spinning@error"]
    title = rep.findings[0].title
    assert title.startswith("rank 1 spins in Python while the others wait: rank 0 waits in all_reduce "
                            "at train.py:17, unchanged for 10.0 s"), title
    assert "main thread not woken once in 9.0 s between samples" in title, title
    assert "rank 1 runs poll_ready at train.py:" in title and "used 9.6 s of CPU in 10.0 s" in title
    assert "switched 0 times in 9.0 s" in rep.findings[0].evidence["rank 0"]
    # the waiting rank woke between dumps (a step ended): slow, not spinning
    woke = proc(10, 0, [collective("all_reduce", 17)] * 5, wakes=1)
    assert codes(ev(woke, proc(11, 1, moving, wakes=40))) == ["rank-waited-for@warning"]
    # asleep over too short a window (3 s between dumps): one long step reads the same
    short = proc(10, 0, [collective("all_reduce", 17)] * 5, wakes=0, every=1.0)
    assert codes(ev(short, proc(11, 1, moving, wakes=40, every=1.0))) == ["rank-waited-for@warning"]
    # no counters (another kernel, an older evidence file): the old judgment, never spinning
    assert codes(ev(proc(10, 0, [collective("all_reduce", 17)] * 5), proc(11, 1, moving))) == [
        "rank-waited-for@warning"]
    # the waiting rank moved between collectives: a step ended, whatever the counters say
    waits = [collective("all_reduce", 17), collective("all_reduce", 27)] * 2 + [collective("all_reduce", 17)]
    assert codes(ev(proc(10, 0, waits, wakes=0), proc(11, 1, moving, wakes=40))) == [
        "rank-waited-for@warning"]
    # the busy rank was once seen in a collective: it reaches them, not a livelock
    once = [collective("all_reduce", 17)] + moving[1:]
    assert codes(ev(asleep, proc(11, 1, once, wakes=40))) == ["rank-waited-for@warning"]


def test_a_rank_that_also_reaches_the_collective_is_not_the_one_waited_for():
    # a balanced job: rank 0 happened to be caught waiting in all 5 samples, rank 1 was seen
    # computing and in the same all_reduce: they take turns, nobody is the straggler
    turns = [collective("all_reduce", 17), code(60), collective("all_reduce", 17), code(61), code(62)]
    e = ev(proc(10, 0, [collective("all_reduce", 17)] * 5), proc(11, 1, turns))
    assert codes(e) == []


def test_different_collectives_are_a_mismatch_naming_both_lines():
    e = ev(proc(10, 0, [collective("all_reduce", 17)] * 5), proc(11, 1, [collective("barrier", 27)] * 5))
    rep = build_report(e, "t")
    assert codes(e) == ["collective-mismatch@error"]
    assert "all_reduce at train.py:17" in rep.findings[0].title
    assert "barrier at train.py:27" in rep.findings[0].title


def test_a_healthy_job_moving_through_collectives_raises_nothing():
    a = [collective("all_reduce", 17), code(20, "step"), collective("all_reduce", 17), code(21, "step"),
         collective("all_reduce", 17)]
    e = ev(proc(10, 0, a), proc(11, 1, list(reversed(a))))
    assert codes(e) == []


def test_all_ranks_waiting_in_the_same_collective_is_not_a_mismatch():
    e = ev(proc(10, 0, [collective("all_reduce", 17)] * 5), proc(11, 1, [collective("all_reduce", 17)] * 5))
    assert codes(e) == []


def test_a_rank_that_ended_is_named():
    gone = {"pid": 11, "rank": 1, "role": "rank", "samples": [{"t": 100, "error": "x", "kind": "gone"}],
            "status": "gone"}
    e = ev(proc(10, 0, [collective("barrier", 27)] * 5), gone)
    rep = build_report(e, "t")
    assert codes(e) == ["collective-hang@error"] and "rank 1 ended" in rep.findings[0].title


def test_a_dataloader_worker_stuck_at_one_line_is_named():
    main = [[fr(DL, 700, "_MultiProcessingDataLoaderIter._next_data"),
             fr(DL, 630, "_BaseDataLoaderIter.__next__"), fr("/job/train.py", 71, "main")]] * 5
    worker = [[fr("/job/ds.py", 12, "__getitem__"), fr(f"{TORCH}/utils/data/_utils/worker.py", 300, "_worker_loop")]] * 5
    e = ev(proc(10, None, main, role="process"), proc(12, None, worker, role="worker", parent=10))
    rep = build_report(e, "t")
    assert codes(e) == ["dataloader-worker-stuck@error"]
    assert "__getitem__ at ds.py:12" in rep.findings[0].title


def test_rss_growth_over_the_window_uses_the_growth_judgment():
    base = ev(proc(10, 0, [code(1)] * 5), proc(11, 1, [code(1)] * 5))
    series = [{"t": 100.0 + i, "procs": {"10": {"rss": 2**30 + i * 50 * 2**20}, "11": {"rss": 2**30}}}
              for i in range(20)]
    base["resources"] = {"series": series, "host_available": 16 * 2**30}
    rep = build_report(base, "t")
    got = [f for f in rep.findings if f.code == "live-memory-growth"]
    assert len(got) == 1 and got[0].evidence["pid"] == 10 and "50.0 MiB/s" in got[0].title
    flat = dict(base, resources={"series": [{"t": 100.0 + i, "procs": {"10": {"rss": 2**30 + (i % 3) * 4096}}}
                                            for i in range(20)], "host_available": 16 * 2**30})
    assert not [f for f in build_report(flat, "t").findings if f.code == "live-memory-growth"]


def test_rss_growth_is_judged_on_the_default_windows_ten_points():
    """Regression: the default --duration 10 gives 10 one-second RSS points; the memory fit's
    default warm-up cut (3 points) left 7, under its minimum of 8, so nothing was ever judged."""
    base = ev(proc(10, None, [code(1)] * 5, role="process"))
    series = [{"t": 100.0 + i, "procs": {"10": {"rss": 300 * 2**20 + i * 4 * 2**20}}} for i in range(10)]
    base["resources"] = {"series": series, "host_available": 16 * 2**30}
    got = [f for f in build_report(base, "t").findings if f.code == "live-memory-growth"]
    assert len(got) == 1 and "grows 4.0 MiB/s" in got[0].title, got


def test_py_spy_output_and_errors_are_parsed():
    out = parse_dump('[{"pid": 5, "thread_id": 1, "thread_name": "MainThread", "os_thread_id": 5, '
                     '"active": true, "owns_gil": true, "frames": [{"name": "f", "filename": "/a.py", '
                     '"line": 3}]}]')
    assert out == [{"tid": 5, "name": "MainThread", "active": True, "gil": True,
                    "frames": [{"name": "f", "file": "/a.py", "line": 3}]}]
    assert classify_error("Error: Operation not permitted (os error 1)") == "permission"
    # py-spy 0.4.3 as a plain user on another user's process (measured here)
    assert classify_error("Permission Denied: Try running again with elevated permissions by going "
                          "'sudo env \"PATH=$PATH\" !!'") == "permission"
    assert classify_error("Error: No such process (os error 3)") == "gone"


def test_flight_recorder_dump_is_read_without_running_code(tmp_path):
    import pickle

    dump = {"version": "2.9", "entries": [
        {"collective_seq_id": 41, "profiling_name": "nccl:all_reduce", "state": "completed",
         "process_group": ("0", "default_pg"), "input_sizes": [[1024]], "output_sizes": [[1024]]},
        {"collective_seq_id": 42, "profiling_name": "nccl:all_reduce", "state": "started",
         "process_group": ("0", "default_pg"), "input_sizes": [[1024]], "output_sizes": [[1024]]}]}
    s = flight.summarise(flight.load_dump(pickle.dumps(dump)))
    assert s["last_completed"]["seq"] == 41 and s["first_pending"]["seq"] == 42
    import os

    class Boom:
        def __reduce__(self):
            return (os.system, ("true",))

    try:
        flight.load_dump(pickle.dumps({"x": Boom()}))
    except pickle.UnpicklingError as e:
        assert "refused" in str(e)
    else:
        raise AssertionError("a global in the dump must be refused")
    assert not flight.enabled({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/x"})


def test_ask_offers_attach_for_a_job_that_hangs_or_slowed_down_now():
    from torchdoctor.triage import matcher

    for text in ("my training has been running for two days and now it is stuck",
                 "the DDP job slowed down after 10 hours",
                 "training hangs right now, can I diagnose it without restarting"):
        a = matcher.triage(text)
        assert a.routes and a.routes[0].probe == "torchdoctor attach --job [PID]", (text, a.routes)
    for text in ("my ddp job hangs at startup", "training is slow"):
        a = matcher.triage(text)
        assert all("attach" not in r.probe for r in a.routes), (text, [r.probe for r in a.routes])


def _gpu(e, utils):
    e["resources"] = {"nvml": True, "series": [
        {"t": 100.0 + i, "procs": {str(p["pid"]): {"rss": 2**30, "gpu": [{"gpu": 0, "mem": 2**30, "util": u}]}
                                   for p in e["processes"]}} for i, u in enumerate(utils)]}
    for p in e["processes"]:
        p["source"] = {"/job/train.py:50": "total += loss.item()"}
    return e


def test_all_ranks_in_a_host_sync_on_idle_gpus_is_a_stall_and_busy_gpus_are_not():
    stuck = [fr("/job/train.py", 50, "train"), fr("/job/train.py", 60, "<module>")]
    e = _gpu(ev(proc(10, 0, [stuck] * 5), proc(11, 1, [stuck] * 5)), [0, 0, 0, 0])
    rep = build_report(e, "t")
    assert codes(e) == ["host-sync-stall@error"]
    assert "ranks 0, 1 wait for the GPU in item() at train.py:50" in rep.findings[0].title
    assert codes(_gpu(ev(proc(10, 0, [stuck] * 5), proc(11, 1, [stuck] * 5)), [0, 95, 97, 99])) == []
    no_nvml = ev(proc(10, 0, [stuck] * 5), proc(11, 1, [stuck] * 5))
    assert codes(no_nvml) == [] and any(s.rule == "host-sync-stall" for s in build_report(no_nvml, "t").skipped)


def test_flight_recorder_is_triggered_through_the_ranks_pipe_and_its_dump_read(tmp_path):
    """The rank's side simulated as torch does it: a FIFO STEM{rank}.pipe opened O_RDONLY|O_NONBLOCK,
    polled; a write to it makes the rank write its trace to TEMP_FILE{rank}."""
    import os
    import pickle
    import threading
    import time

    stem, out = str(tmp_path / "fr_"), str(tmp_path / "trace_rank_")
    os.mkfifo(f"{stem}1.pipe")
    fd = os.open(f"{stem}1.pipe", os.O_RDONLY | os.O_NONBLOCK)
    dump = {"version": "2.9", "entries": [
        {"collective_seq_id": 7, "profiling_name": "nccl:all_reduce", "state": "completed"},
        {"collective_seq_id": 8, "profiling_name": "nccl:broadcast", "state": "scheduled"}]}

    def rank_side():
        for _ in range(100):
            try:
                if os.read(fd, 128):
                    with open(f"{out}1", "wb") as f:
                        pickle.dump(dump, f)
                    return
            except BlockingIOError:
                pass
            time.sleep(0.02)

    t = threading.Thread(target=rank_side)
    t.start()
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem,
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": out}
    assert flight.enabled(env)
    got = flight.trigger_and_read(env, 1)
    t.join()
    os.close(fd)
    assert got["last_completed"]["seq"] == 7 and got["first_pending"]["op"] == "nccl:broadcast", got
    # a rank without its pipe: an error line, never a hang
    assert "could not trigger" in flight.trigger_and_read({**env}, 0)["error"]


def test_a_dump_written_by_torchs_own_pickler_is_read():
    """The trace is written by torch's TorchScript pickler: int lists come wrapped in
    torch.jit._pickle.build_intlist and typed dicts in restore_type_tag (the bytes below are that
    pickler's, taken from torch's own archive writer); those map to plain values, anything else is
    refused."""
    import io
    import zipfile

    import pytest

    torch = pytest.importorskip("torch")
    if not hasattr(torch._C, "_pickle_save"):
        pytest.skip("this torch has no _pickle_save")
    archive = zipfile.ZipFile(io.BytesIO(bytes(torch._C._pickle_save({"input_sizes": [[2, 3]]}))))
    raw = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    assert b"build_intlist" in raw and b"restore_type_tag" in raw
    assert flight.load_dump(raw) == {"input_sizes": [[2, 3]]}


def test_recorder_summary_is_per_process_group_and_its_dump_is_found_where_the_version_writes_it(tmp_path):
    import os
    import pickle
    import threading
    import time

    e = lambda seq, state, pg="0", op="nccl:all_reduce", **kw: {  # noqa: E731
        "collective_seq_id": seq, "profiling_name": op, "state": state,
        "process_group": (pg, "default_pg" if pg == "0" else "tp"), **kw}
    dump = {"version": "2.10", "entries": [e(5, "completed"), e(6, "scheduled"), e(90, "completed", "1"),
                                           e(0, "scheduled", op="nccl:send", is_p2p=True)]}
    s = flight.summarise(dump)
    assert (s["pg"], s["last_completed"]["seq"], s["first_pending"]["seq"]) == ("0", 5, 6)
    assert s["pgs"]["1"]["last_completed"]["seq"] == 90 and s["entries"] == 3
    # no dump variable in the rank's environment: the 2.13 default under its cache folder is watched
    env = {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "fr_"), "HOME": str(tmp_path / "home"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    cands = flight.dump_candidates(env, 1)
    assert cands == [str(tmp_path / "cache" / "torch" / "comm_lib_trace_rank_1"),
                     str(tmp_path / "home" / ".cache" / "torch" / "nccl_trace_rank_1"), "/tmp/nccl_trace_rank_1"]
    assert flight.dump_candidates({**env, "TORCH_FR_DUMP_TEMP_FILE": "/d/t_"}, 1) == ["/d/t_1"]
    assert not flight.enabled(env, 1)  # buffer size unset and no pipe: the rank made none
    os.mkfifo(f"{env['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}1.pipe")
    assert flight.enabled(env, 1) and not flight.enabled({**env, "TORCH_FR_BUFFER_SIZE": "0"}, 1)
    fd = os.open(f"{env['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}1.pipe", os.O_RDONLY | os.O_NONBLOCK)

    def rank_side():
        for _ in range(200):
            try:
                if os.read(fd, 128):
                    os.makedirs(os.path.dirname(cands[0]), exist_ok=True)
                    with open(cands[0], "wb") as f:
                        pickle.dump(dump, f)
                    return
            except BlockingIOError:
                pass
            time.sleep(0.02)

    t = threading.Thread(target=rank_side)
    t.start()
    got = flight.trigger_and_read(env, 1)
    t.join()
    os.close(fd)
    assert got["file"] == cands[0] and got["first_pending"]["seq"] == 6, got


def test_the_recorder_names_a_collective_one_rank_never_called():
    """NCCL: the waiting rank's all_reduce returned at once, its stack is at the next sync; the
    other rank sits elsewhere. Only the recorder's sequence numbers name the hang."""
    sync = [fr(f"{TORCH}/cuda/__init__.py", 1083, "synchronize"), *code(33, "main")]
    sleep = code(40, "main")
    ranks = {"0": {"last_completed": {"seq": 5, "op": "nccl:all_reduce", "state": "completed", "pg": ["0", "default_pg"]},
                   "first_pending": {"seq": 6, "op": "nccl:all_reduce", "state": "scheduled", "pg": ["0", "default_pg"],
                                     "input_sizes": [[1024]]}},
             "1": {"last_completed": {"seq": 5, "op": "nccl:all_reduce", "state": "completed", "pg": ["0", "default_pg"]},
                   "first_pending": None}}
    e = ev(proc(10, 0, [sync] * 5), proc(11, 1, [sleep] * 5), fr_state={"state": "read", "ranks": ranks})
    rep = build_report(e, "t")
    assert codes(e) == ["collective-hang@error"]
    title = rep.findings[0].title
    assert title.startswith("rank 0 waits in nccl:all_reduce seq 6 (Flight Recorder: scheduled, input sizes "
                            "[[1024]]); rank 1 never called seq 6: its last collective is seq 5"), title
    assert "rank 0 runs main at train.py:33" in title and "rank 1 runs main at train.py:40" in title, title
    # the same judgment from the summaries of dumps shaped as torch writes them (pg as a tuple)
    def dump(n_done, pending):
        e = [{"collective_seq_id": i, "profiling_name": "nccl:all_reduce", "state": "completed",
              "process_group": ("0", "default_pg"), "input_sizes": [[1024]], "is_p2p": False}
             for i in range(1, n_done + 1)]
        if pending:
            e.append({**e[-1], "collective_seq_id": n_done + 1, "state": "scheduled"})
        return {"version": "2.10", "entries": e}
    summed = {"0": flight.summarise(dump(5, True)), "1": flight.summarise(dump(5, False))}
    e2 = ev(proc(10, 0, [sync] * 5), proc(11, 1, [sleep] * 5), fr_state={"state": "read", "ranks": summed})
    assert build_report(e2, "t").findings[0].title == title
    # the same snapshot of a job that moves: collectives in flight, no hang
    moving = [code(30 + i, "main") for i in range(5)]
    assert codes(ev(proc(10, 0, moving), proc(11, 1, [sleep] * 5),
                    fr_state={"state": "read", "ranks": ranks})) == []
    # every rank has seq 6 pending: nobody skipped it (not this finding)
    both = {r: {**d, "first_pending": ranks["0"]["first_pending"]} for r, d in ranks.items()}
    assert codes(ev(proc(10, 0, [sync] * 5), proc(11, 1, [sync] * 5),
                    fr_state={"state": "read", "ranks": both})) == []


GIL_RAW = """thread (700): MainThread;<module> (train.py:51);main (train.py:44);SGD.step (torch/optim/sgd.py:127) 4
thread (1144): stats;Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982);stats_thread (train.py:25);summarise (train.py:19) 122
thread (1144): stats;Thread._bootstrap (threading.py:1002);Thread.run (threading.py:982);stats_thread (train.py:25);summarise (train.py:18) 7
thread (0x7f3a);Thread._bootstrap (threading.py:1002);poll (mon.py:3) 2
not a py-spy line
"""


def test_gil_record_lines_are_counted_per_thread():
    from torchdoctor.attach.sampler import parse_gil_raw

    threads = parse_gil_raw(GIL_RAW)
    assert [(t["tid"], t["name"], t["samples"], t["top"]) for t in threads] == [
        (1144, "stats", 129, "summarise at train.py:19"), (700, "MainThread", 4, "SGD.step at torch/optim/sgd.py:127"),
        (0x7F3A, "", 2, "poll at mon.py:3")]


def _gil_proc(held_by_stats, main_stacks=None):
    from torchdoctor.attach.sampler import parse_gil_raw

    p = proc(700, None, main_stacks or [code(44 + i % 2, "main") for i in range(5)], role="process")
    raw = GIL_RAW.replace(" 122\n", f" {held_by_stats}\n").replace(" 7\n", " 0\n")
    p["gil"] = {"rate_hz": 50, "seconds": 3, "threads": parse_gil_raw(raw)}
    return p


def test_a_thread_holding_the_gil_most_of_the_window_is_named():
    rep = build_report(ev(_gil_proc(122)), "t")
    assert [f.code for f in rep.findings] == ["gil-held-by-thread"]
    f = rep.findings[0]
    assert f.title == ("pid 700: thread 'stats' (tid 1144) held the GIL in 81% of 150 samples over 3 s, "
                       "mostly in summarise at train.py:19; the main thread held it in 3%"), f.title
    assert f.severity == "warning" and f.evidence["gil_samples"] == 122
    # under half of the samples (a monitor thread doing some work): nothing
    assert codes(ev(_gil_proc(74))) == []
    # the main thread only joins that thread: it is the training thread, by design
    join = [[fr("/usr/lib/python3.11/threading.py", 1119, "Thread._wait_for_tstate_lock"),
             fr("/usr/lib/python3.11/threading.py", 1099, "Thread.join"), *code(44, "main")]] * 5
    assert codes(ev(_gil_proc(122, join))) == []
    # no record (py-spy record failed): not judged, never a finding
    p = _gil_proc(122)
    p["gil"] = {"error": "py-spy record exited 1 without output"}
    assert codes(ev(p)) == []


def test_a_dump_reads_the_main_threads_counters_after_it_has_gone_back_to_sleep(monkeypatch):
    """Regression (test_attach's spinning rank judged rank-waited-for once, in CI): a thread that
    is blocked for good goes back to sleep after a dump only when it is scheduled again, which on
    a loaded box comes after the dump returned; that switch must not count as a wake."""
    from torchdoctor.attach import sampler, session

    monkeypatch.setattr(sampler, "dump", lambda *a: {"t": 100.0, "read_s": 0.05, "threads": []})
    late = iter([{"switches": 10, "cpu_ns": 1}, {"switches": 12, "cpu_ns": 1},  # before, at return
                 {"switches": 13, "cpu_ns": 1}, {"switches": 13, "cpu_ns": 1}])  # re-blocked, settled
    d = session._dump("py-spy", 5, 10.0, False, False, counters=lambda pid: next(late), sleep=lambda s: None)
    assert d["main_before"]["switches"] == 10 and d["main_after"]["switches"] == 13
    assert d["read_s"] >= 0.05

    spinning = iter(range(1000))  # a running thread never settles: bounded by SETTLE_READS
    d = session._dump("py-spy", 5, 10.0, False, False,
                      counters=lambda pid: {"switches": next(spinning), "cpu_ns": 1}, sleep=lambda s: None)
    assert d["main_after"]["switches"] == 1 + session.SETTLE_READS
