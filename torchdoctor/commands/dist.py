"""`torchdoctor dist [OPTS] [SCRIPT [ARGS]...]`: distributed environment audit + collective self-test.

Without SCRIPT: audit launch variables, backends, NCCL_*/TORCH_NCCL_* settings and GPU
topology, then run the collective self-test under torchrun on the local GPUs (gloo on CPU).
Running a SCRIPT under dist needs the runner (not built yet).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from torchdoctor.commands._common import FailOnOpt, JsonOpt, emit, guarded
from torchdoctor.errors import DoctorError


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
        script: Annotated[Optional[str], typer.Argument(metavar="SCRIPT", help="(not yet) a training script to run under "
                                                             "torchrun.", show_default=False)] = None,
        args: Annotated[Optional[list[str]], typer.Argument(metavar="[ARGS]...", help="Arguments passed to SCRIPT.",
                                                            show_default=False)] = None,
        nproc_per_node: Annotated[Optional[int], typer.Option(
            "--nproc-per-node", help="Self-test ranks (default: GPU count, or 2 gloo ranks on CPU).",
            show_default=False)] = None,
        backend: Annotated[str, typer.Option("--backend", help="auto, nccl or gloo.",
                                             metavar="auto|nccl|gloo")] = "auto",
        selftest: Annotated[bool, typer.Option("--selftest/--no-selftest",
                                               help="Run the collective self-test.")] = True,
        sizes: Annotated[Optional[str], typer.Option(
            "--sizes", help="All-reduce sizes, e.g. 1M,64M,1G (default 1M..1G on GPU, 64K..4M on CPU).",
            show_default=False)] = None,
        timeout: Annotated[Optional[float], typer.Option(
            "--timeout", help="Wall-clock bound of the self-test in seconds (default 180 GPU, 60 CPU).",
            show_default=False)] = None,
        out: Annotated[Optional[str], typer.Option("--out", help="Folder for the report and rank files.",
                                                   show_default=False)] = None,
        as_json: JsonOpt = False,
        fail_on: FailOnOpt = "error",
    ) -> None:
        if script is not None:
            raise DoctorError("running a script under dist needs the runner (not built yet)",
                              hint="run `torchdoctor dist` without a script for the environment audit "
                                   "and collective self-test")
        from torchdoctor.dist.probe import DistOptions, parse_sizes, run_dist

        b = backend.strip().lower()
        if b not in ("auto", "nccl", "gloo"):
            raise DoctorError(f"--backend must be auto, nccl or gloo, not {backend!r}")
        if timeout is not None and timeout <= 0:
            raise DoctorError(f"--timeout must be positive, not {timeout:g}")
        opts = DistOptions(nproc=nproc_per_node, backend=b, selftest=selftest, timeout_s=timeout,
                           sizes=parse_sizes(sizes) if sizes is not None else None, out_dir=out)
        emit(run_dist(opts), as_json, fail_on, out)
