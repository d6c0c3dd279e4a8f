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


def unreadable_report(path: str, e: Unreadable, seen: list | None = None) -> Report:
    """``ckpt-unreadable`` plus the safety judgment of every pickle scanned before the failure."""
    rep = Report("checkpoint-audit", target=path, context=context())
    try:
        size = os.path.getsize(path) if os.path.isfile(path) else None
    except OSError:
        size = None
    ev = {"path": e.path or path, "problem": e.what, "detail": e.detail}
    if size is not None:
        ev["bytes"] = size
    rep.add(finding(
        "ckpt-unreadable", f"{e.what}: {e.detail}", ev,
        fix="Check that the file is complete (compare its size with the source, re-copy or re-download) and "
            "that it is a torch.save / safetensors / DCP checkpoint.",
    ))
    rep.metrics["checkpoint"] = {"path": path, "format": "unreadable", "problem": e.what}
    pickles = list(e.pickles)
    pickles += [p for p in seen or [] if not any(p is q for q in pickles)]
    if pickles:  # what was scanned before the failure is still judged for safety
        from torchdoctor.checkpoint.roles import Roles
        from torchdoctor.checkpoint.rules import Evidence, Judgment, guarded, rule_unsafe_pickle
        from torchdoctor.checkpoint.values import Contents

        j = Judgment()
        guarded(rule_unsafe_pickle, Evidence(Contents(path, "unreadable", pickles=pickles), Roles()), j)
        for f in j.findings:
            rep.add(f)
    return rep


def _read(path: str, seen: list):
    """The reader, with every failure it can have on crafted bytes turned into :class:`Unreadable`."""
    from torchdoctor.checkpoint import detect
    from torchdoctor.checkpoint.values import brief
    from torchdoctor.errors import DoctorError

    try:
        return detect.read(path)
    except (Unreadable, DoctorError):
        raise
    except RecursionError:
        raise Unreadable("unreadable checkpoint", "structure nested too deeply (or referring to itself) to read",
                         path) from None
    except MemoryError:
        raise Unreadable("unreadable checkpoint", "reading it needs more memory than torchdoctor allows",
                         path) from None
    except OSError as e:
        raise Unreadable("unreadable checkpoint", f"{type(e).__name__}: {e.strerror or brief(str(e), 200)}",
                         path) from None
    except Exception as e:  # noqa: BLE001 - crafted input can provoke anything in a parser
        raise Unreadable("unreadable checkpoint", f"{type(e).__name__}: {brief(str(e), 200)}", path) from None


def run(path: str, opts: Options) -> Report:
    from torchdoctor.checkpoint.pickle_scan import collecting

    with collecting() as seen:
        try:
            contents = _read(path, seen)
        except Unreadable as e:
            return unreadable_report(path, e, seen)
        # parts that failed inside a folder/index were noted as problems; their pickles are judged too
        contents.pickles += [p for p in seen if p.error and not any(p is q for q in contents.pickles)]
    if os.path.isfile(path):  # one file of an accelerate/Trainer/DeepSpeed/DCP folder is a part, not a whole
        from torchdoctor.checkpoint.layout import sibling_layout

        contents.layout = sibling_layout(path)
    if opts.unsafe_load:
        from torchdoctor.checkpoint.unsafe import unsafe_load

        stub_root = contents.root
        try:
            contents.root = unsafe_load(contents)
        except Unreadable as e:
            return unreadable_report(path, e, contents.pickles)
        contents.unsafe_loaded = True
    else:
        stub_root = contents.root
    return _judge(path, contents, stub_root, opts)


def _judge(path: str, contents, stub_root, opts: Options) -> Report:
    from torchdoctor.checkpoint.roles import Roles, recognise
    from torchdoctor.checkpoint.rules import Evidence, judge
    from torchdoctor.checkpoint.scan import scan_tensors
    from torchdoctor.checkpoint.summary import build
    from torchdoctor.checkpoint.walk import iter_tensors

    rep = Report("checkpoint-audit", target=path, context=context())
    roles = _step(rep, "roles", lambda: recognise(contents.root)) or Roles()
    scan, scan_skip = None, None
    if opts.scan:
        scan = _step(rep, "scan", lambda: scan_tensors(list(iter_tensors(contents.root))))
        scan_skip = None if scan is not None else "the scan failed (see internal-error)"
    else:
        scan_skip = "--no-scan"
    spec = None
    if opts.model:
        from torchdoctor.checkpoint.compare import load_model_spec

        spec = load_model_spec(opts.model)
    ev = Evidence(contents=contents, roles=roles, scan=scan, scan_skip=scan_skip, expect=opts.expect,
                  model_spec=spec, stub_root=stub_root)
    j = judge(ev)
    for f in j.findings:
        rep.add(f)
    for rule, reason in j.skipped:
        rep.skip(rule, reason)
    summary = _step(rep, "summary", lambda: build(contents, roles, scan, j.mode, opts.expect, j.facts, stub_root))
    rep.metrics["checkpoint"] = summary or {"path": path, "format": contents.format, "judged_as": j.mode}
    if contents.unsafe_loaded:
        rep.metrics["checkpoint"]["unsafe_load"] = True
    return rep


def _step(rep: Report, name: str, fn):
    """Run one stage of the audit; a crash becomes an internal-error finding and the report goes on."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        import traceback

        from torchdoctor.checkpoint.values import brief
        from torchdoctor.findings import internal_finding
        from torchdoctor.report.safe import visible

        rep.add(internal_finding(
            f"checkpoint audit stage '{name}' failed: {type(e).__name__}",
            {"stage": name, "error": brief(str(e) if not isinstance(e, RecursionError) else "recursion", 300),
             "traceback": [visible(x)[:500] for x in traceback.format_exception(type(e), e, e.__traceback__,
                                                                                limit=-4)]},
        ))
        return None


def warn_unsafe() -> None:
    print("torchdoctor: warning: --unsafe-load unpickles the checkpoint with weights_only=False: any code it "
          "carries RUNS NOW, with your permissions. Use it only on files you made or fully trust.",
          file=sys.stderr, flush=True)
