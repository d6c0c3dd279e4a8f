"""`torchdoctor dist [OPTS] [SCRIPT [ARGS]...]`: distributed environment audit + collective self-test.

Without SCRIPT: audit launch variables, backends, NCCL_*/TORCH_NCCL_* settings and GPU
topology, then run the collective self-test under torchrun on the local GPUs (gloo on CPU).
With SCRIPT (or -m MODULE): run it under torchrun on --nproc-per-node ranks (default: the GPU
count, or 2 on CPU) with the distributed instruments (collective recorder, sampler checks,
per-rank step clock): the ``dist`` script probe, one report merged across ranks.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from torchdoctor.commands._common import FailOnOpt, HtmlOpt, JsonOpt, JunitOpt, SarifOpt, emit, eprint, guarded
from torchdoctor.commands._nodeopts import node_params
from torchdoctor.errors import DoctorError
from torchdoctor.pipeline.options import DEFAULT_STEPS, DEFAULT_TIMEOUT_S, RunOptions

_N = {p.name: p.annotation for p in node_params()}  # --nnodes & co. (torchrun's rendezvous options)


def run_script(target: str, args: list[str], module: bool, nproc: int | None, steps: int,
               timeout: float | None, out: str | None, as_json: bool, fail_on: str,
               node=None, html=None, outputs=None) -> None:
    """``torchdoctor dist SCRIPT``: check the options, build the run's options, print the
    pipeline's report (:func:`torchdoctor.pipeline.dist.run_script`)."""
    from torchdoctor.commands._common import check_fail_on
    from torchdoctor.pipeline.dist import default_nproc, run_script as dist_script

    if steps < 0:
        raise DoctorError(f"--steps must be >= 0, not {steps}")
    if timeout is not None and not timeout > 0:
        raise DoctorError(f"--timeout must be > 0 seconds, not {timeout:g}")
    if nproc is not None and nproc < 1:
        raise DoctorError(f"--nproc-per-node must be at least 1, not {nproc}")
    check_fail_on(fail_on)
    timeout = timeout or DEFAULT_TIMEOUT_S
    n = nproc or default_nproc()
    bound = f"up to {steps} steps, " if steps else ""
    where = f" of node {node.node_rank} (of {node.nnodes})" if node is not None else ""
    eprint(f"torchdoctor dist: running {'-m ' if module else ''}{target}"
           f"{' ' + ' '.join(args) if args else ''} on {n} ranks{where} ({bound}timeout {timeout:g} s)")
    options = RunOptions(steps=steps, timeout=timeout, out=out, module=module, nproc_per_node=n, node=node)
    report = dist_script(target, args, options)
    emit(report, as_json, fail_on, out, html=html, outputs=outputs)


def register(app: typer.Typer) -> None:
    @app.command(
        help="Distributed / NCCL environment audit and a collective self-test on the local GPUs "
             "(gloo on CPU): correctness of all_reduce, all_gather, reduce_scatter, broadcast and an "
             "all-reduce bus-bandwidth sweep judged against the NVLink/PCIe links.",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                          "allow_interspersed_args": False},
    )
    @guarded
    def dist(
        script: Annotated[Optional[str], typer.Argument(
            metavar="SCRIPT", show_default=False,
            help="A training script to run under torchrun with the distributed instruments "
                 "(instead of the self-test).")] = None,
        args: Annotated[Optional[list[str]], typer.Argument(metavar="[ARGS]...", help="Arguments passed to SCRIPT.",
                                                            show_default=False)] = None,
        module: Annotated[Optional[str], typer.Option(
            "-m", "--module", metavar="MODULE", show_default=False,
            help="Run a module (like python -m) instead of SCRIPT.")] = None,
        steps: Annotated[int, typer.Option(
            "--steps", metavar="N",
            help="With SCRIPT: stop every rank cleanly after N optimizer steps (0: no limit).")] = DEFAULT_STEPS,
        nproc_per_node: Annotated[Optional[int], typer.Option(
            "--nproc-per-node", help="Ranks (default: GPU count, or 2 gloo ranks on CPU).",
            show_default=False)] = None,
        backend: Annotated[str, typer.Option("--backend", help="auto, nccl or gloo.",
                                             metavar="auto|nccl|gloo")] = "auto",
        selftest: Annotated[bool, typer.Option("--selftest/--no-selftest",
                                               help="Run the collective self-test.")] = True,
        sizes: Annotated[Optional[str], typer.Option(
            "--sizes", help="All-reduce sizes, e.g. 1M,64M,1G (default 1M..1G on GPU, 64K..4M on CPU).",
            show_default=False)] = None,
        timeout: Annotated[Optional[float], typer.Option(
            "--timeout", help="Wall-clock bound in seconds (self-test: 180 GPU, 60 CPU; SCRIPT: 300).",
            show_default=False)] = None,
        out: Annotated[Optional[str], typer.Option("--out", help="Folder for the report and rank files.",
                                                   show_default=False)] = None,
        as_json: JsonOpt = False,
        fail_on: FailOnOpt = "error",
        nnodes: _N["nnodes"] = None,
        node_rank: _N["node_rank"] = None,
        rdzv_endpoint: _N["rdzv_endpoint"] = None,
        rdzv_backend: _N["rdzv_backend"] = None,
        rdzv_id: _N["rdzv_id"] = None,
        rdzv_timeout: _N["rdzv_timeout"] = None,
        max_restarts: _N["max_restarts"] = None,
        html: HtmlOpt = None,
        sarif: SarifOpt = None,
        junit: JunitOpt = None,
    ) -> None:
        from torchdoctor.commands._common import check_fail_on, prepare_html, prepare_out, prepare_outputs
        from torchdoctor.commands._nodeopts import resolve_node

        check_fail_on(fail_on)  # bad usage: exit 2 before a self-test or a run, not after
        node = resolve_node(dict(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                                 rdzv_backend=rdzv_backend, rdzv_id=rdzv_id,
                                 rdzv_timeout=rdzv_timeout, max_restarts=max_restarts))
        out = prepare_out(out)
        html_path = prepare_html(html, out)
        outputs = prepare_outputs(sarif=sarif, junit=junit)
        if script is not None or module is not None:
            if backend.strip().lower() != "auto" or sizes is not None or not selftest:
                raise DoctorError("--backend, --sizes and --no-selftest apply to the self-test, not "
                                  "to a script (the script chooses its own backend)")
            extra = list(args or [])
            if module is not None and script is not None:
                extra = [script] + extra
            run_script(module or script, extra, module is not None, nproc_per_node, steps, timeout,
                       out, as_json, fail_on, node, html=html_path, outputs=outputs)
            return
        from torchdoctor.distributed.probe import DistOptions, parse_sizes
        from torchdoctor.pipeline.dist import run_dist

        b = backend.strip().lower()
        if b not in ("auto", "nccl", "gloo"):
            raise DoctorError(f"--backend must be auto, nccl or gloo, not {backend!r}")
        if timeout is not None and timeout <= 0:
            raise DoctorError(f"--timeout must be positive, not {timeout:g}")
        opts = DistOptions(nproc=nproc_per_node, backend=b, selftest=selftest, timeout_s=timeout,
                           sizes=parse_sizes(sizes) if sizes is not None else None, out_dir=out,
                           node=node)
        emit(run_dist(opts), as_json, fail_on, out, html=html_path, outputs=outputs)
