"""Issue 30 item 3: the runs torchdoctor launches through torchrun carry the NCCL Flight Recorder
(buffer, dump pipe and dump file in the run dir) unless the user set their own, say so in the
report, and at the timeout poke each NCCL rank's pipe; the dump NCCL writes is read like the
watcher thread's. Fast: no torch, no process (a named pipe opened like torch's DumpPipe)."""

from __future__ import annotations

import json
import os
import pickle

from torchdoctor.distributed import frpipe
from torchdoctor.distributed.rankdir import FR_DUMP_STEM, FR_PIPE_STEM
from torchdoctor.distributed.torchrun import FR_BUFFER, RankSet, flight_env, quiet_patterns
from torchdoctor.evidence.ranks import merged_evidence, read_fr

ALL = {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
       "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}


def test_a_launch_without_flight_recorder_variables_gets_all_of_them_in_its_run_dir(tmp_path):
    env = RankSet(tmp_path, 2).env({"PATH": "/bin"})
    assert ALL <= set(env)
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == FR_BUFFER
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == str(tmp_path / FR_PIPE_STEM)
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / FR_DUMP_STEM)


def test_the_users_own_flight_recorder_settings_are_never_overridden(tmp_path):
    # a user who turned the recorder off under the newer name keeps it off under both
    assert flight_env({"TORCH_FR_BUFFER_SIZE": "0"}, tmp_path).keys() == {
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
    mine = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/mine/p_",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/mine/d_"}
    assert flight_env(mine, tmp_path) == {}
    rs = RankSet(tmp_path, 2)
    env = rs.env(mine)
    assert {k: env[k] for k in mine} == mine and "TORCH_FR_BUFFER_SIZE" not in env
    assert rs.flight_recorder() == {"set": {}, "pipe": "/mine/p_"}


def test_what_was_set_is_stated_in_the_merged_result(tmp_path):
    (tmp_path / "rank0").mkdir()
    rs = RankSet(tmp_path, 1)
    rs.env({"TORCH_FR_BUFFER_SIZE": "100"})
    top = rs.finish({"outcome": "exit", "exit_code": 0, "returncode": 0, "output_tail": []})
    fr = top["flight_recorder"]
    assert set(fr["set"]) == ALL - {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}
    assert fr["pipe"] == str(tmp_path / FR_PIPE_STEM)


def test_the_deprecation_warnings_of_the_older_names_are_dropped_only_when_we_set_them():
    assert len(quiet_patterns({})) == len(quiet_patterns({"TORCH_NCCL_TRACE_BUFFER_SIZE": "1"})) + 1
    assert any("TORCH_NCCL_DEBUG_INFO_TEMP_FILE" in p for p in quiet_patterns({}))
    assert not any("TORCH_NCCL_DEBUG_INFO_TEMP_FILE" in p
                   for p in quiet_patterns({"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x"}))


def _pipe_like_torch(path) -> int:
    """What DumpPipe does: mkfifo, open O_RDONLY|O_NONBLOCK (the watchdog polls it)."""
    os.mkfifo(path, 0o600)
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK)


def test_at_the_timeout_every_nccl_ranks_pipe_is_poked_and_then_removed(tmp_path, monkeypatch):
    rs = RankSet(tmp_path, 2)
    rs.env({})
    monkeypatch.setattr(rs, "pids", lambda: {0: 111, 1: 222})  # two live ranks
    monkeypatch.setattr(rs, "signal_ranks", lambda sig: None)
    fd = _pipe_like_torch(tmp_path / f"{FR_PIPE_STEM}0.pipe")  # rank 1 is gloo: no pipe
    try:
        rs.request_dumps()
        assert os.read(fd, 16) == b"1\n"
    finally:
        os.close(fd)
    assert rs.fr_poked == {str(tmp_path / f"{FR_PIPE_STEM}0.pipe"): "written"}
    # a pipe nobody reads any more (the rank died): said, never waited on
    rs.fr_poked.clear()
    rs.poke_flight_recorders()
    assert "could not trigger" in rs.fr_poked[str(tmp_path / f"{FR_PIPE_STEM}0.pipe")]
    rs.remove_pipes()
    assert not list(tmp_path.glob("*.pipe"))


def test_after_a_poke_the_parent_waits_for_nccls_dump_within_the_bound(tmp_path, monkeypatch):
    import torchdoctor.distributed.torchrun as tr

    rs = RankSet(tmp_path, 1)
    rs.env({})
    monkeypatch.setattr(rs, "pids", lambda: {0: 111})
    monkeypatch.setattr(rs, "signal_ranks", lambda sig: None)
    monkeypatch.setattr(tr, "DUMP_WAIT_MIN_S", 0.0)
    (tmp_path / "rank0").mkdir()
    fd = _pipe_like_torch(tmp_path / f"{FR_PIPE_STEM}0.pipe")
    try:
        rs.request_dumps()
        (tmp_path / "rank0" / "dump.done").write_text("{}")  # the watcher thread answered
        assert not rs.dumps_done()  # NCCL's dump is not there yet
        (tmp_path / f"{FR_DUMP_STEM}0").write_bytes(b"x")
        assert rs.dumps_done()
    finally:
        os.close(fd)


def test_a_gloo_launch_pokes_nothing(tmp_path, monkeypatch):
    rs = RankSet(tmp_path, 2)
    rs.env({})
    monkeypatch.setattr(rs, "pids", lambda: {0: 111, 1: 222})
    rs.poke_flight_recorders()
    assert rs.fr_poked == {} and "poked" not in rs.flight_recorder()


def _entry(seq, state, op="nccl:all_reduce"):
    return {"collective_seq_id": seq, "process_group": ("0", "default_pg"), "profiling_name": op,
            "input_sizes": [[1024]], "input_dtypes": ["Float"], "state": state, "is_p2p": False}


def test_the_dump_nccl_wrote_through_the_pipe_is_read_when_it_holds_more(tmp_path):
    d = tmp_path / "rank0"
    d.mkdir()
    # the watcher thread could not run (its dump is empty); NCCL's watchdog wrote the trace
    (d / "fr_trace.json").write_text(json.dumps({"version": "2.10", "entries": []}))
    dump = {"version": "2.10", "entries": [_entry(5, "completed"), _entry(6, "scheduled")]}
    (tmp_path / f"{FR_DUMP_STEM}0").write_bytes(pickle.dumps(dump))
    fr = read_fr(d, tmp_path / f"{FR_DUMP_STEM}0")
    assert fr["source"] == "nccl-pipe" and [e["seq"] for e in fr["entries"]] == [5, 6]
    assert fr["entries"][1]["completed"] is False and fr["entries"][0]["pg"] == "default_pg"
    (d / "meta.json").write_text(json.dumps({"rank": 0}))
    (d / "result.json").write_text(json.dumps({"outcome": "timeout"}))
    _, merged = merged_evidence(tmp_path, 1)
    assert [e["source"] for e in merged.of("fr_entries")] == ["nccl-pipe"]


def test_a_dump_that_is_not_a_flight_recorder_trace_is_left_out(tmp_path):
    class Boom:
        def __reduce__(self):
            return (os.getcwd, ())

    bad = tmp_path / "bad"
    bad.write_bytes(pickle.dumps({"x": Boom()}))
    assert frpipe.read_dump(bad) is None
    (tmp_path / "list").write_bytes(pickle.dumps([1, 2]))
    assert frpipe.read_dump(tmp_path / "list") is None
    assert read_fr(tmp_path, bad) is None
