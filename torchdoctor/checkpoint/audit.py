"""The audit pipeline: read → (optional unsafe load) → roles → scan → rules → Report."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass

from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.findings import Report, finding

EXPECT = ("auto", "resume", "weights")


@dataclass
class Options:
    expect: str = "auto"
    model: str | None = None
    unsafe_load: bool = False
    scan: bool = True


def context() -> dict:
    """Report header without importing torch (its import alone costs ≈ 1.5 s)."""
    ctx = {"python": platform.python_version(), "device": "n/a (file audit)"}
    try:
        from importlib.metadata import version

        ctx["torch"] = version("torch") + " (not imported)"
    except Exception:  # noqa: BLE001
        ctx["torch"] = "not installed"
    return ctx


def unreadable_report(path: str, e: Unreadable) -> Report:
    rep = Report("checkpoint-audit", target=path, context=context())
    size = os.path.getsize(path) if os.path.isfile(path) else None
    ev = {"path": e.path or path, "problem": e.what, "detail": e.detail}
    if size is not None:
        ev["bytes"] = size
    rep.add(finding(
        "ckpt-unreadable", f"{e.what}: {e.detail}", ev,
        fix="Check that the file is complete (compare its size with the source, re-copy or re-download) and "
            "that it is a torch.save / safetensors / DCP checkpoint.",
    ))
    rep.metrics["checkpoint"] = {"path": path, "format": "unreadable", "problem": e.what}
    if e.pickles:  # what was scanned before the failure is still judged for safety
        from torchdoctor.checkpoint.roles import Roles
        from torchdoctor.checkpoint.rules import Evidence, Judgment, rule_unsafe_pickle
        from torchdoctor.checkpoint.values import Contents

        j = Judgment()
        rule_unsafe_pickle(Evidence(Contents(path, "unreadable", pickles=e.pickles), Roles()), j)
        for f in j.findings:
            rep.add(f)
    return rep


def run(path: str, opts: Options) -> Report:
    from torchdoctor.checkpoint import detect

    try:
        contents = detect.read(path)
    except Unreadable as e:
        return unreadable_report(path, e)
    stub_root = contents.root
    if opts.unsafe_load:
        from torchdoctor.checkpoint.unsafe import unsafe_load

        contents.root = unsafe_load(contents)
        contents.unsafe_loaded = True
    from torchdoctor.checkpoint.roles import recognise
    from torchdoctor.checkpoint.rules import Evidence, judge
    from torchdoctor.checkpoint.scan import scan_tensors
    from torchdoctor.checkpoint.summary import build
    from torchdoctor.checkpoint.walk import iter_tensors

    roles = recognise(contents.root)
    scan, scan_skip = None, None
    if opts.scan:
        scan = scan_tensors(list(iter_tensors(contents.root)))
    else:
        scan_skip = "--no-scan"
    spec = None
    if opts.model:
        from torchdoctor.checkpoint.compare import load_model_spec

        spec = load_model_spec(opts.model)
    ev = Evidence(contents=contents, roles=roles, scan=scan, scan_skip=scan_skip, expect=opts.expect,
                  model_spec=spec, stub_root=stub_root)
    j = judge(ev)
    rep = Report("checkpoint-audit", target=path, context=context())
    for f in j.findings:
        rep.add(f)
    for rule, reason in j.skipped:
        rep.skip(rule, reason)
    rep.metrics["checkpoint"] = build(contents, roles, scan, j.mode, opts.expect, j.facts, stub_root)
    if contents.unsafe_loaded:
        rep.metrics["checkpoint"]["unsafe_load"] = True
    return rep


def warn_unsafe() -> None:
    print("torchdoctor: warning: --unsafe-load unpickles the checkpoint with weights_only=False: any code it "
          "carries RUNS NOW, with your permissions. Use it only on files you made or fully trust.",
          file=sys.stderr, flush=True)
