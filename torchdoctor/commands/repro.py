"""``torchdoctor repro [OPTS] SCRIPT [ARGS]...``: does the same script give the same run?

Runs SCRIPT twice (same argv and environment, bounded by ``--steps``; torchdoctor seeds
nothing), compares the runs step by step and, when they differ, localises the first differing
op and attributes the cause (``torchdoctor/reprocheck``, rules in ``rules/repro_runs.py``).
The options are the script probes' (``commands/_script.py``) plus ``--op-engine``;
``--nproc-per-node N`` only with ``--resume-check`` (the resume check on N ranks:
``reprocheck/resume_ranked.py``), refused otherwise (``distributed/oneprocess.py``).
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from torchdoctor.commands._common import emit, eprint, guarded_runs
from torchdoctor.errors import DoctorError

HELP = ("Run SCRIPT twice and compare the runs step by step (data batch, forward outputs, "
        "loss, gradients, update; bitwise). When they differ: the first divergent step and what "
        "diverged first, the first differing op (op, module, file:line; a second bounded pair), "
        "and the cause: unseeded-rng (which global generator, where it was drawn), "
        "nondeterministic-op (with the measured cost of deterministic mode) or "
        "nondeterministic-run. torchdoctor never seeds the script.")
DEFAULT_STEPS = 20
ENGINES = ("auto", "debug_mode", "dispatch")


def register(app: typer.Typer) -> None:
    from torchdoctor.commands._script import CONTEXT_SETTINGS, one_process_params

    @guarded_runs
    def repro(**kw: Any) -> None:
        ctx: typer.Context = kw.pop("ctx")
        script, module = kw.pop("script"), kw.pop("module")
        steps, timeout = kw.pop("steps"), kw.pop("timeout")
        as_json, out, fail_on = kw.pop("json_out"), kw.pop("out"), kw.pop("fail_on")
        engine = str(kw.pop("op_engine")).strip().lower()
        resume, html = kw.pop("resume_check"), kw.pop("html")
        from torchdoctor.commands._script import require_target
        from torchdoctor.distributed.oneprocess import refuse

        nproc = kw.pop("nproc_per_node")
        if nproc is not None and not resume:
            refuse("repro", nproc)  # before the script is looked for: no run starts
        if nproc is not None and nproc < 1:
            raise DoctorError(f"--nproc-per-node must be >= 1, not {nproc}")

        target, args = require_target("repro", script, module, list(ctx.args))
        if steps < 1:
            raise DoctorError(f"--steps must be >= 1 for repro (the runs are bounded), not {steps}")
        if not timeout > 0:
            raise DoctorError(f"--timeout must be > 0 seconds, not {timeout}")
        if engine not in ENGINES:
            raise DoctorError(f"--op-engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        from torchdoctor.commands._common import check_fail_on, prepare_html, prepare_out
        from torchdoctor.pipeline.run import check_target

        check_fail_on(fail_on)
        check_target(target, bool(module))
        out = prepare_out(out)
        html_path = prepare_html(html, out)
        from torchdoctor.commands._common import prepare_outputs

        outputs = prepare_outputs(sarif=kw.pop("sarif"), junit=kw.pop("junit"))
        how = (f"on {nproc} ranks under torchrun: the resume check (up to {steps} steps a run" if nproc else
               f"twice (up to {steps} steps each")
        eprint(f"torchdoctor repro: running {'-m ' if module else ''}{target}"
               f"{' ' + ' '.join(args) if args else ''} {how}, timeout {timeout:g} s per run)")
        from torchdoctor.reprocheck.flow import repro_report

        from torchdoctor.pipeline.options import RunOptions

        options = RunOptions(steps=steps, timeout=timeout, out=out, module=bool(module),
                             steps_default=DEFAULT_STEPS, nproc_per_node=nproc)
        report = repro_report(target, args, options, engine=engine, resume=resume)
        emit(report, as_json, fail_on, out, html=html_path, outputs=outputs)

    P = inspect.Parameter
    from torchdoctor.distributed.oneprocess import nproc_param

    from torchdoctor.pipeline.options import DEFAULT_TIMEOUT_S

    params = one_process_params(DEFAULT_STEPS, DEFAULT_TIMEOUT_S)  # one process: no ranks, no nodes
    params.append(nproc_param("repro", help="With --resume-check: run the script on N ranks under torchrun "
                                             "and check its resume rank by rank (a DCP save or a save on every "
                                             "rank). Plain repro refuses it (the error says why)."))
    params.append(P("resume_check", P.KEYWORD_ONLY, default=False, annotation=Annotated[bool, typer.Option(
        "--resume-check", help="Also prove the script's own checkpoint resumes exactly: after its "
                               "save, reset each state the file lacks (one more run each) and "
                               "measure what differs (docs/resume.md).")]))
    params.append(P("op_engine", P.KEYWORD_ONLY, default="auto", annotation=Annotated[str, typer.Option(
        "--op-engine", metavar="auto|debug_mode|dispatch",
        help="How the localising pair hashes ops: torch's DebugMode where the installed torch "
             "has log_tensor_hashes (auto), or a TorchDispatchMode.")]))
    repro.__signature__ = inspect.Signature(params)
    repro.__name__ = "repro"
    repro.__doc__ = HELP
    app.command("repro", help=HELP, context_settings=dict(CONTEXT_SETTINGS))(repro)
