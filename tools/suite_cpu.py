"""Where the suite's CPU goes: every process the test run starts, with its command line and CPU.

The kernel's BSD process accounting (``acct(2)``, root only) writes one record per process that
exits — its pid, parent, start time and user/system CPU, however it exits (``os._exit``, a
signal). It does not keep the command line, so a one-line ``.pth`` hook in the venv's
site-packages appends, for each Python process that starts, its pid, argv and the test that was
running (``PYTEST_CURRENT_TEST``, which pytest's children inherit; the background fixture lanes'
children have none). Joining the two by pid says what each process was and what it cost.

    python tools/suite_cpu.py start DIR      # turn accounting on, install the hook
    make test                                # or any pytest command
    python tools/suite_cpu.py stop DIR       # accounting off, hook removed
    python tools/suite_cpu.py report DIR     # CPU by kind of process, by test file, the top tests

Measurement only: nothing in the suite or the package reads it.
"""

from __future__ import annotations

import collections
import ctypes
import json
import struct
import sys
import sysconfig
from pathlib import Path

HOOK_NAME = "zz_suite_cpu_hook.pth"
ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")  # struct acct_v3, 64 bytes (linux/acct.h)
AHZ = 100  # acct_v3 comp_t times are in 1/100 s


def _comp_t(v: int) -> float:
    return (v & 0x1FFF) << (3 * (v >> 13))


def _site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def start(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "acct.bin").write_bytes(b"")
    starts = out / "starts.jsonl"
    starts.write_text("")
    hook = (
        "import os, sys, json; "
        "open(%r, 'a').write(json.dumps({'pid': os.getpid(), 'ppid': os.getppid(), "
        "'argv': sys.argv[:40] if hasattr(sys, 'argv') else [], "
        "'orig': list(getattr(sys, 'orig_argv', []))[:40], "
        "'test': os.environ.get('PYTEST_CURRENT_TEST', '')}) + '\\n')\n" % str(starts)
    )
    (_site_packages() / HOOK_NAME).write_text(hook)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(str(out / "acct.bin").encode()) != 0:
        raise SystemExit(f"acct() failed: errno {ctypes.get_errno()} (root needed)")


def stop(out: Path) -> None:
    ctypes.CDLL(None).acct(None)
    (_site_packages() / HOOK_NAME).unlink(missing_ok=True)


def _records(out: Path):
    data = (out / "acct.bin").read_bytes()
    for off in range(0, len(data) - ACCT_V3.size + 1, ACCT_V3.size):
        f = ACCT_V3.unpack_from(data, off)
        (_flag, _ver, _tty, exitcode, _uid, _gid, pid, ppid, btime, etime,
         utime, stime, *_rest, comm) = f
        yield {"pid": pid, "ppid": ppid, "btime": btime, "etime": etime / AHZ,
               "cpu": (_comp_t(utime) + _comp_t(stime)) / AHZ,
               "comm": comm.split(b"\0")[0].decode(errors="replace"), "exit": exitcode}


def _kind(argv: list[str], orig: list[str]) -> str:
    text = " ".join(orig or argv)
    if "-m pytest" in text or (orig and orig[0].endswith("pytest")) or "exec(eval(sys.stdin" in text:
        return "pytest"  # the run, or one of its xdist workers (execnet's bootstrap)
    if "torchdoctor.runner" in text or "_runner" in text:
        return "runner child"
    if "torch.distributed.run" in text or "torchrun" in text:
        return "torchrun agent"
    if "-m torchdoctor" in text or text.endswith("torchdoctor") or "/torchdoctor " in text:
        return "torchdoctor CLI"
    if "-c" in (orig or argv):
        return "python -c"
    return "script / other"


def report(out: Path, top: int = 400) -> None:
    starts = {}
    for line in (out / "starts.jsonl").read_text().splitlines():
        try:
            s = json.loads(line)
        except ValueError:
            continue
        starts[s["pid"]] = s
    recs = list(_records(out))
    total = sum(r["cpu"] for r in recs)
    by_kind = collections.Counter()
    n_kind = collections.Counter()
    by_file = collections.Counter()
    by_test = collections.Counter()
    n_test = collections.Counter()
    # a process with no start line (a non-Python program, or a Python process that forked)
    # belongs to the nearest ancestor that has one
    parent = {r["pid"]: r["ppid"] for r in recs}
    for s in starts.values():
        parent.setdefault(s["pid"], s["ppid"])

    def owner(pid):
        seen = 0
        while pid and seen < 50:
            if pid in starts:
                return starts[pid]
            pid = parent.get(pid)
            seen += 1
        return None

    for r in recs:
        s = owner(r["pid"])
        if s is None:
            kind, test = "untracked:" + r["comm"], ""
        else:
            kind = _kind(s.get("argv") or [], s.get("orig") or [])
            if s["pid"] != r["pid"]:
                kind += " (fork/exec below)"
            test = s.get("test", "")
        if kind.startswith("pytest") and not test:
            test = "(pytest process itself)"
        by_kind[kind] += r["cpu"]
        n_kind[kind] += 1
        test_id = test.split(" (")[0] if test else "(background fixture lane)"
        if not test and s is not None:
            head = s
            while head.get("ppid") in starts and _kind([], starts[head["ppid"]].get("orig") or []) != "pytest":
                head = starts[head["ppid"]]
            words = [a for a in (head.get("orig") or [])[1:] if not a.startswith("/") or a.endswith(".py")]
            script = next((a for a in words if a.endswith(".py")), "")
            cmd = next((w for w in words[words.index("torchdoctor") + 1:] if not w.startswith("-")), "") \
                if "torchdoctor" in words else ""
            test_id = f"(lane) {cmd} " + "/".join(Path(script).parts[-2:]) if (script or cmd) else test_id
        by_test[test_id] += r["cpu"]
        n_test[test_id] += 1
        by_file[test_id.split("::")[0] if not test_id.startswith("(lane)") else "(lanes)"] += r["cpu"]
    print(f"processes: {len(recs)}   CPU: {total:.0f} s\n")
    print("by kind of process")
    for k, v in by_kind.most_common():
        print(f"  {v:8.1f} s  {n_kind[k]:5d}  {k}")
    print("\nby test file")
    for k, v in by_file.most_common(top):
        print(f"  {v:8.1f} s  {k}")
    print(f"\ntop {top} tests")
    for k, v in by_test.most_common(top):
        print(f"  {v:8.1f} s  {n_test[k]:4d}  {k}")


if __name__ == "__main__":
    cmd, where = sys.argv[1], Path(sys.argv[2])
    {"start": start, "stop": stop, "report": report}[cmd](where)
