"""``torchdoctor treat [OPTS] SCRIPT [ARGS]...``: each fix applied to the unmodified script, measured.

A bounded baseline run under the checkup instruments (its findings are the report's), then
trials chosen from those findings and the device (or ``--try NAME[=VALUE]``), each a bounded run
with the treatment applied in the child, alternating with baseline rounds, then the adopted
treatments together. The schedule lives in :mod:`torchdoctor.treat.session`; the treatments in
:mod:`torchdoctor.treat`; docs/treat.md says how each verdict is reached.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Optional

import typer

from torchdoctor.commands._common import eprint, guarded_runs

HELP = ("Measure the cure: run SCRIPT once under the checkup instruments, then try each fix its "
        "findings and the device point at (DataLoader workers, pinned memory, TF32, bf16 autocast, "
        "channels-last, fused optimizer, cuDNN benchmark, expandable segments, compile, "
        "set_to_none; on N ranks: DDP bucket_cap_mb, FSDP2 bf16 MixedPrecisionPolicy, per-block "
        "compile) in-process on the unmodified script, alternating with baseline runs, and "
        "say which to adopt, with the file:line and the code to write there.")
DEFAULT_STEPS = 30
DEFAULT_ROUNDS = 2
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True,
                    "allow_interspersed_args": False}


def _params() -> list:
    from torchdoctor.commands._script import one_process_params
    from torchdoctor.pipeline.options import DEFAULT_TIMEOUT_S

    P = inspect.Parameter
    kw = P.KEYWORD_ONLY
    params = one_process_params(DEFAULT_STEPS, DEFAULT_TIMEOUT_S)  # one node: no --nnodes & co.
    return params + [
        P("nproc_per_node", kw, default=None, annotation=Annotated[Optional[int], typer.Option(
            "--nproc-per-node", metavar="N", min=1, show_default=False,
            help="Run every trial on N local ranks through torchrun (DDP/FSDP2 scripts), timed on "
                 "the slowest rank; the data-parallel trials (DDP bucket_cap_mb, FSDP2 bf16 "
                 "MixedPrecisionPolicy, per-block compile) join the plan.")]),
        P("try_", kw, default=None, annotation=Annotated[Optional[list[str]], typer.Option(
            "--try", metavar="NAME[=VALUE]", show_default=False,
            help="Try this treatment (repeatable); replaces the automatic choice. "
                 "--list names them.")]),
        P("list_", kw, default=False, annotation=Annotated[bool, typer.Option(
            "--list", help="Print the catalogue of treatments (what each changes, when it applies).")]),
        P("budget", kw, default=None, annotation=Annotated[Optional[float], typer.Option(
            "--budget", metavar="SECONDS", show_default=False,
            help="Bound the whole treat run; no run starts once it is spent.")]),
        P("rounds", kw, default=DEFAULT_ROUNDS, annotation=Annotated[int, typer.Option(
            "--rounds", metavar="N", min=2, help="Runs of the baseline and of each trial (>= 2).")]),
    ]


def print_catalogue(as_json: bool) -> None:
    from torchdoctor.treat.catalogue import CATALOGUE

    if as_json:
        import sys

        from torchdoctor.report.jsonout import dumps

        rows = [{"name": t.name, "changes": t.changes, "applies": t.applies, "device": t.device,
                 "intent": t.intent, "loss_tolerance": t.tolerance, "value": t.value or None,
                 "scope": t.scope}
                for t in CATALOGUE]
        sys.stdout.write(dumps({"tool": "torchdoctor", "command": "treat", "catalogue": rows}) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_lines=True, title="torchdoctor treat --try NAME[=VALUE]")
    for col in ("name", "what it changes", "when it is tried"):
        table.add_column(col, overflow="fold")
    for t in CATALOGUE:
        name = t.name + (f"\n={t.value.split(':')[0]}" if t.value else "")
        table.add_row(name, t.changes, t.applies + ("" if t.device == "any" else
                                                    "  [CUDA only]" if t.device == "cuda" else
                                                    "  [CPU with --try]") + (
                          "  [--nproc-per-node only]" if t.scope == "ranked" else ""))
    Console(highlight=False).print(table)


@guarded_runs
def treat(**kw: Any) -> None:
    from torchdoctor.errors import DoctorError

    ctx: typer.Context = kw["ctx"]
    as_json = kw["json_out"]
    if kw["list_"]:
        print_catalogue(as_json)
        return
    from torchdoctor.commands._script import require_target

    target, args = require_target("treat", kw["script"], kw["module"], list(ctx.args))
    module = kw["module"]
    steps, timeout, budget = kw["steps"], kw["timeout"], kw["budget"]
    if steps < 0:
        raise DoctorError(f"--steps must be >= 0, not {steps}")
    if not timeout > 0:
        raise DoctorError(f"--timeout must be > 0 seconds, not {timeout}")
    from torchdoctor.trials.session import MIN_RUN_S

    if budget is not None and not budget >= MIN_RUN_S:
        raise DoctorError(f"--budget must be at least {MIN_RUN_S:g} seconds (one run), not {budget:g}")
    from torchdoctor.commands._common import check_fail_on, emit, prepare_html, prepare_out
    from torchdoctor.pipeline.run import check_target
    from torchdoctor.treat.catalogue import parse_try

    fail_on = check_fail_on(kw["fail_on"])
    forced = None
    if kw["try_"]:
        try:
            forced = [parse_try(s) for s in kw["try_"]]
        except ValueError as e:
            raise DoctorError(str(e)) from None
    check_target(target, bool(module))
    out = prepare_out(kw["out"])
    html = prepare_html(kw.get("html"), out)
    from torchdoctor.commands._common import prepare_outputs

    outputs = prepare_outputs(sarif=kw.get("sarif"), junit=kw.get("junit"))
    from torchdoctor.pipeline.options import RunOptions

    nproc = kw["nproc_per_node"]  # set: every run through torchrun (treat/ranked_session.py)
    options = RunOptions(steps=steps, timeout=timeout, out=out, module=bool(module),
                         steps_default=DEFAULT_STEPS, nproc_per_node=nproc)
    shown = f"{'-m ' if module else ''}{target}{' ' + ' '.join(args) if args else ''}"
    bound = f"up to {steps} steps a run, " if steps else ""
    bound = f"{nproc} ranks, {bound}" if nproc is not None else bound
    eprint(f"torchdoctor treat: running {shown} ({bound}timeout {timeout:g} s a run"
           f"{f', budget {budget:g} s' if budget else ''})")
    from torchdoctor.treat.ranked_session import RankedTreatSession
    from torchdoctor.treat.session import TreatSession

    session = RankedTreatSession if nproc is not None else TreatSession
    report = session(target, args, options, budget_s=budget, forced=forced,
                     rounds=kw["rounds"], progress=eprint).run()
    emit(report, as_json, fail_on, out, html=html, outputs=outputs)


def register(app: typer.Typer) -> None:
    treat.__signature__ = inspect.Signature(_params())
    app.command("treat", help=HELP, context_settings=dict(CONTEXT_SETTINGS))(treat)
