"""The common CLI of every script probe: ``torchdoctor PROBE [OPTS] SCRIPT [ARGS]...``.

``script_command(app, "memory", help, probe="memory", extra_options=[...])`` registers a
command with the shared options (``--steps``, ``--timeout``, ``--json``, ``--out``,
``--fail-on``, ``-m MODULE``) plus the probe's own; everything after SCRIPT is passed to the
script verbatim (parsing stops at SCRIPT, so ``train.py --steps 3`` gives ``--steps 3`` to the
script). The command builds one :class:`~torchdoctor.pipeline.options.RunOptions` (the
``extra_options`` in its ``probe`` mapping, by key) and hands it to ``run_probe``; the options land
in ``ctx.options`` inside the child under the same names.

    from torchdoctor.commands._script import ExtraOption, script_command

    def register(app):
        script_command(app, "nan", "First non-finite value: module, op, step.", probe="nan",
                       extra_options=[ExtraOption("check_every", "--check-every", int, 1,
                                                  "check every N steps")])
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Optional

import typer

from torchdoctor.commands._common import (FailOnOpt, HtmlOpt, JsonOpt, JunitOpt, SarifOpt, emit, eprint,
                                          guarded_runs)
from torchdoctor.commands._nodeopts import node_params, resolve_node
from torchdoctor.errors import DoctorError
from torchdoctor.pipeline.options import DEFAULT_STEPS, DEFAULT_TIMEOUT_S, RunOptions
CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True,
                    "allow_interspersed_args": False}


@dataclass(frozen=True)
class ExtraOption:
    """A probe-specific option: ``key`` in ctx.options, ``flag`` on the command line."""

    key: str
    flag: str
    type: type = str
    default: Any = None
    help: str = ""
    metavar: str | None = None
    min: float | None = None  # lowest accepted value (numbers): below it is a usage error, exit 2


@dataclass(frozen=True)
class Resolved:
    """What a probe's ``resolve_target`` makes of the command line (``gradcheck FILE.py:Name``
    runs a driver module instead of a script): the target to launch, whether it is a module, its
    arguments, the target shown in the report, and a function applied to the report after the run."""

    target: str
    module: bool
    args: list[str]
    shown: str | None = None
    post: Callable[[Any], None] | None = None


# the options of several processes or machines: not for commands that run one process at a
# time (treat, repro: see one_process_params)
MULTI_PROCESS_OPTIONS = frozenset({"nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint",
                                   "rdzv_backend", "rdzv_id", "rdzv_timeout", "max_restarts"})


def script_target(name: str, script: str | None, module: str | None,
                  args: list[str]) -> tuple[str, list[str]] | None:
    """(target, args) from SCRIPT / ``-m MODULE`` (with -m, a SCRIPT word is the module's first
    argument); None when neither was given."""
    if module:
        return module, ([script] if script is not None else []) + list(args)
    if script is not None:
        return script, list(args)
    return None


def require_target(name: str, script: str | None, module: str | None,
                   args: list[str]) -> tuple[str, list[str]]:
    """As :func:`script_target`; neither given is bad usage (exit 2)."""
    got = script_target(name, script, module, args)
    if got is None:
        raise DoctorError("missing SCRIPT (or -m MODULE)", hint=f"torchdoctor {name} train.py --your-args ...")
    return got


def one_process_params(steps_default: int, timeout_default: float) -> list:
    """The shared options without those of several processes or machines."""
    return [p for p in _params([], steps_default, timeout_default) if p.name not in MULTI_PROCESS_OPTIONS]


def _params(extra: list[ExtraOption], steps_default: int, timeout_default: float) -> list:
    P = inspect.Parameter
    kw = P.KEYWORD_ONLY
    params = [
        P("ctx", kw, annotation=typer.Context),
        P("script", kw, default=None, annotation=Annotated[Optional[str], typer.Argument(
            metavar="SCRIPT [ARGS]...", show_default=False,
            help="The training script; everything after it is passed to it untouched.")]),
        P("module", kw, default=None, annotation=Annotated[Optional[str], typer.Option(
            "-m", "--module", metavar="MODULE", help="Run a module (like python -m) instead of SCRIPT.")]),
        P("steps", kw, default=steps_default, annotation=Annotated[int, typer.Option(
            "--steps", metavar="N", help="Stop the script cleanly after N optimizer steps (0: no limit).")]),
        P("timeout", kw, default=timeout_default, annotation=Annotated[float, typer.Option(
            "--timeout", metavar="SECONDS",
            help="Wall-clock bound; a hung script is stopped and shown where it was stuck.")]),
        P("json_out", kw, default=False, annotation=JsonOpt),
        P("out", kw, default=None, annotation=Annotated[Optional[str], typer.Option(
            "--out", metavar="DIR", help="Write the report and artifacts (traces, snapshots) to DIR.")]),
        P("fail_on", kw, default="error", annotation=FailOnOpt),
        P("html", kw, default=None, annotation=HtmlOpt),
        P("sarif", kw, default=None, annotation=SarifOpt),
        P("junit", kw, default=None, annotation=JunitOpt),
        P("nproc_per_node", kw, default=None, annotation=Annotated[Optional[int], typer.Option(
            "--nproc-per-node", metavar="N", min=1, show_default=False,
            help="Run SCRIPT on N local ranks through torchrun; one report merged across ranks.")]),
        *node_params(),
    ]
    for e in extra:
        params.append(P(e.key, kw, default=e.default, annotation=Annotated[
            Optional[e.type] if e.default is None else e.type,
            typer.Option(e.flag, help=e.help, metavar=e.metavar,
                         **({"min": e.min} if e.min is not None else {}))]))
    return params


def script_command(app: typer.Typer, name: str, help: str, probe: str | None = None,
                   extra_options: list[ExtraOption] | tuple = (), *,
                   steps_default: int = DEFAULT_STEPS, timeout_default: float = DEFAULT_TIMEOUT_S,
                   target_override: Callable[[], tuple[str, list[str]]] | None = None,
                   resolve_target: Callable[..., Resolved | None] | None = None,
                   after: Callable[..., None] | None = None) -> Callable:
    """Register ``name`` on ``app`` as a script probe running ``probe`` (default: ``name``).

    ``target_override`` (for ``demo``): returns (script, args) to run when none is given.
    ``resolve_target(target, module, args, probe_options)`` (for ``gradcheck``; the probe's own
    options, a dict it may take its own keys from): a :class:`Resolved`
    that replaces the target, or None to run it as given; raises DoctorError on bad input.
    ``after(report, target, args, options)`` (for ``compile``'s eager trial; ``options``: the
    run's :class:`RunOptions`): completes the report after the probe's run, before it is rendered.
    """
    probe = probe or name
    extra = list(extra_options)

    @guarded_runs
    def command(**kw: Any) -> None:
        ctx: typer.Context = kw.pop("ctx")
        script, module = kw.pop("script"), kw.pop("module")
        steps, timeout = kw.pop("steps"), kw.pop("timeout")
        as_json, out, fail_on = kw.pop("json_out"), kw.pop("out"), kw.pop("fail_on")
        html = kw.pop("html")
        sarif, junit = kw.pop("sarif"), kw.pop("junit")
        nproc = kw.pop("nproc_per_node")
        node = resolve_node(kw)  # --nnodes & co., or SLURM_*: one agent per node (exit 2 if unfit)
        if node is not None and nproc is None:
            nproc = 1  # torchrun's own default
        got = script_target(name, script, module, list(ctx.args))
        if got is None and target_override is not None:
            got = target_override()
        target, args = got if got is not None else require_target(name, script, module, [])
        if steps < 0:
            raise DoctorError(f"--steps must be >= 0, not {steps}")
        if not timeout > 0:
            raise DoctorError(f"--timeout must be > 0 seconds, not {timeout}")
        from torchdoctor.commands._common import check_fail_on

        check_fail_on(fail_on)
        probe_opts = dict(kw)  # probe-specific options, by key (resolve_target may take its own)
        resolved = resolve_target(target, bool(module), args, probe_opts) if resolve_target else None
        if resolved is not None:
            target, module, args = resolved.target, resolved.module, list(resolved.args)
        bound = f"up to {steps} steps, " if steps else ""
        bound = f"{nproc} ranks, {bound}" if nproc is not None else bound
        if node is not None:
            bound = f"node {node.node_rank} of {node.nnodes}, {bound}"
        from torchdoctor.pipeline.run import check_target, run_probe

        check_target(target, bool(module))  # bad input: one line, before any banner
        from torchdoctor.commands._common import prepare_out

        out = prepare_out(out)  # an unfit --out: exit 2 before the run
        from torchdoctor.commands._common import prepare_html

        html_path = prepare_html(html, out)  # an unfit --html: exit 2 before the run too
        from torchdoctor.commands._common import prepare_outputs

        outputs = prepare_outputs(sarif=sarif, junit=junit)  # the same for --sarif/--junit
        shown = resolved.shown if resolved is not None and resolved.shown else (
            f"{'-m ' if module else ''}{target}{' ' + ' '.join(args) if args else ''}")
        eprint(f"torchdoctor {name}: running {shown} ({bound}timeout {timeout:g} s)")

        # nproc_per_node: torchrun, one run dir per rank (torchdoctor.distributed)
        options = RunOptions(steps=steps, timeout=timeout, out=out, module=bool(module),
                             steps_default=steps_default, nproc_per_node=nproc, node=node,
                             probe=probe_opts)
        report = run_probe(probe, target, args, options)
        if after is not None:
            after(report, target, args, options)
        if name != probe:
            report.command = name
        if resolved is not None:
            if resolved.shown:
                report.target = resolved.shown
            if resolved.post is not None:
                resolved.post(report)
        emit(report, as_json, fail_on, out, html=html_path, outputs=outputs)

    command.__signature__ = inspect.Signature(_params(extra, steps_default, timeout_default))
    command.__name__ = name.replace("-", "_")
    command.__doc__ = help
    app.command(name, help=help, context_settings=dict(CONTEXT_SETTINGS))(command)
    return command
