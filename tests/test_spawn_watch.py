"""The fast lane's line (tests/spawn_watch.py): which process starts count, and which tests are listed."""

import threading

import spawn_watch as sw


def test_a_python_start_from_the_test_counts_a_program_or_a_lane_does_not():
    calls = []
    fork_exec = sw._wrap_fork_exec(lambda args, *rest: calls.append(args) or 4242)
    sw._state.update(node="t::x", count=0, what=[])
    try:
        assert fork_exec([b"/usr/bin/python3", b"-c", b"pass"]) == 4242
        fork_exec([b"/bin/sleep", b"1"])  # not Python: milliseconds, not counted
        lane = threading.Thread(target=fork_exec, args=([b"/venv/bin/python", b"x.py"],),
                                name=sw.LANE_PREFIX + "0")  # the background fixture lanes are no test's
        lane.start()
        lane.join()
        assert sw._state["count"] == 1 and sw._state["what"] == ["python3"] and len(calls) == 3
    finally:
        sw._state.update(node=None, count=0, what=[])


def test_outside_a_test_nothing_is_counted():
    sw._state.update(node=None, count=0, what=[])
    sw._wrap_spawn(lambda path, argv, *rest: 1)("/usr/bin/python3", ["python3", "x.py"])
    assert sw._state["count"] == 0


def test_a_test_is_listed_by_id_by_id_without_parameters_or_by_file():
    listed = {"tests/test_a.py::test_one[p1]", "tests/test_b.py::test_two", "tests/test_c.py"}
    assert sw.listed_slow("tests/test_a.py::test_one[p1]", listed)
    assert not sw.listed_slow("tests/test_a.py::test_one[p2]", listed)
    assert sw.listed_slow("tests/test_b.py::test_two[any]", listed)
    assert sw.listed_slow("tests/test_c.py::test_anything", listed)
    assert not sw.listed_slow("tests/test_b.py::test_twofold", listed)


def test_the_slow_list_reads_ids_and_skips_comments():
    nodes = sw.slow_nodes()
    assert nodes and all(n.startswith("tests/test_") and "#" not in n for n in nodes)


def test_a_lanes_reaped_child_cpu_is_kept_apart_from_the_tests():
    import subprocess

    real = sw.os.waitpid
    sw.os.waitpid = sw._wrap_waitpid(real)
    try:
        before = sw._lane_cpu[0]
        burn = ["/bin/sh", "-c", "i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done"]  # ~0.1 s of CPU
        subprocess.run(burn, check=True)  # the test's own: not the lanes'
        assert sw._lane_cpu[0] == before
        lane = threading.Thread(target=subprocess.run, args=(burn,), name=sw.LANE_PREFIX + "0")
        lane.start()
        lane.join()
        assert sw._lane_cpu[0] - before >= 0.02  # wait4 gave the lane's child's usage
    finally:
        sw.os.waitpid = real
