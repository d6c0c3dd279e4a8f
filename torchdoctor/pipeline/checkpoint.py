"""``checkpoint-audit`` through the pipeline: read → (optional unsafe load) → roles → scan →
evidence → judge → Report.

The reading and the facts are the checkpoint package's (:mod:`torchdoctor.checkpoint`: readers
that never unpickle code, ``derive.py``); the rules of probe ``checkpoint-audit``
(``torchdoctor/rules/checkpoint_*.py``) judge the evidence through the one guarded
:func:`torchdoctor.judge.judge`: a rule that crashes on odd input becomes an ``internal-error``
finding and the rest of the report stands; so does a stage of the audit that crashes
(:func:`_step`).

    from torchdoctor.pipeline.checkpoint import Options, run
    report = run("model.pt", Options(expect="resume"))
"""

from __future__ import annotations

import os
import platform

from torchdoctor.checkpoint.audit import EXPECT, Options, read  # noqa: F401 - the audit's options
from torchdoctor.checkpoint.errors import Unreadable
from torchdoctor.findings import Report, finding


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
        from torchdoctor.checkpoint.evidence import CheckpointEvidence
        from torchdoctor.checkpoint.pickle_globals import classify
        from torchdoctor.checkpoint.roles import Roles
        from torchdoctor.checkpoint.values import Contents

        ev = CheckpointEvidence(Contents(path, "unreadable", pickles=pickles), Roles())
        ev.globals = _step(rep, "derive pickle globals", lambda: classify(ev))
        if ev.globals is not None:
            judged = _judged(ev, only={"ckpt-unsafe-pickle"})
            for f in judged.findings:
                rep.add(f)
    return rep


def run(path: str, opts: Options) -> Report:
    from torchdoctor.checkpoint.pickle_scan import collecting

    with collecting() as seen:
        try:
            contents = read(path, seen)
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
    from torchdoctor.checkpoint.derive import derive
    from torchdoctor.checkpoint.evidence import CheckpointEvidence
    from torchdoctor.checkpoint.roles import Roles, recognise
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
    ev = CheckpointEvidence(contents=contents, roles=roles, scan=scan, scan_skip=scan_skip, expect=opts.expect,
                            model_spec=spec, stub_root=stub_root)
    derive(ev, lambda name, fn: _step(rep, name, fn))
    judged = _judged(ev)
    for f in judged.findings:
        rep.add(f)
    rep.skipped += judged.skipped
    summary = _step(rep, "summary", lambda: build(contents, roles, scan, ev.mode, opts.expect, ev.facts, stub_root))
    rep.metrics["checkpoint"] = summary or {"path": path, "format": contents.format, "judged_as": ev.mode}
    if contents.unsafe_loaded:
        rep.metrics["checkpoint"]["unsafe_load"] = True
    return rep


# The order in which the report lists the checkpoint findings (within a severity) and the skipped
# rules: an audit's reading order — can it be read, is it safe to load, what is it, what does it
# hold, are the tensors sound, does it fit the model. Presentation only: the rules run in name order,
# each on the evidence alone; a rule not named here is listed after these.
READING_ORDER = (
    "ckpt-unreadable", "ckpt-unsafe-pickle", "ckpt-full-model-pickle", "ckpt-part-file", "ckpt-missing-model",
    "ckpt-missing-optimizer", "ckpt-missing-scheduler", "ckpt-missing-rng", "ckpt-missing-progress",
    "ckpt-missing-scaler", "ckpt-weights-export", "ckpt-nonfinite-weights", "ckpt-model-mismatch",
    "ckpt-wrapper-prefix", "ckpt-optimizer-mismatch", "ckpt-device-tensors",
)


def _judged(ev, only: set[str] | None = None) -> Report:
    """The findings and skips of the checkpoint rules on ``ev``, in :data:`READING_ORDER`."""
    from torchdoctor.judge import judge

    out = Report("checkpoint-audit")
    judge("checkpoint-audit", ev, out, only=only)

    def place(name: str) -> int:
        return READING_ORDER.index(name) if name in READING_ORDER else len(READING_ORDER)

    # a finding is placed by its code (ckpt-weights-export raises ckpt-missing-optimizer), a crash by its rule
    out.findings.sort(key=lambda f: place(f.evidence.get("rule", "") if f.code == "internal-error" else f.code))
    out.skipped.sort(key=lambda s: place(s.rule))
    return out


def _step(rep: Report, name: str, fn):
    """Run one stage of the audit; a crash becomes an internal-error finding and the report goes on."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        import traceback

        from torchdoctor.checkpoint.values import brief
        from torchdoctor.findings import internal_finding
        from torchdoctor.safe import visible

        rep.add(internal_finding(
            f"checkpoint audit stage '{name}' failed: {type(e).__name__}",
            {"stage": name, "error": brief(str(e) if not isinstance(e, RecursionError) else "recursion", 300),
             "traceback": [visible(x)[:500] for x in traceback.format_exception(type(e), e, e.__traceback__,
                                                                                limit=-4)]},
        ))
        return None
