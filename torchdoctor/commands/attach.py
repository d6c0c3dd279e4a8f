"""`torchdoctor attach PID... | --job [PID]`: diagnose a running job without restarting it.

Read-only and bounded (docs/attach.md): py-spy reads the stacks (no signal is sent to the
target), psutil and NVML read counters, the NCCL Flight Recorder is asked for through the rank's
own pipe when the job was started with it. Exit 2 with the fix when a PID cannot be read.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from torchdoctor.commands._common import FailOnOpt, HtmlOpt, JsonOpt, JunitOpt, SarifOpt, emit, guarded
from torchdoctor.errors import DoctorError

HELP = (
    "Diagnose a running job without restarting it: where every rank and thread is (Python stacks "
    "sampled with py-spy over --duration), stuck or moving, memory and GPU use, the NCCL Flight "
    "Recorder when the job has it. Give the PIDs, or --job [PID] for every local rank of a torchrun "
    "job (PID: the launcher or any rank; none: the one job running here). Never signals the target.")
MAX_DURATION_S = 3600.0


def _targets(pids: list[int], job: bool):
    from torchdoctor.attach.procs import job_targets, target

    if job:
        if len(pids) > 1:
            raise DoctorError("--job takes at most one PID (the launcher's, or one rank's)",
                              "torchdoctor attach --job PID, or torchdoctor attach PID PID ...")
        targets, facts = job_targets(pids[0] if pids else None)
        label = (f"torchrun job {facts.get('run_id')}: ranks "
                 + ", ".join(str(t.rank) for t in targets))
        return targets, facts, label
    if not pids:
        raise DoctorError("give the PIDs to attach to, or --job", "torchdoctor attach PID [PID...]")
    seen, targets = set(), []
    for p in pids:
        if p not in seen:
            seen.add(p)
            targets.append(target(p))
    return targets, {}, "PID " + ", ".join(str(t.pid) for t in targets)


def _node(nnodes, node_rank, rdzv_endpoint, rdzv_id, job: bool):
    """The multi-node spec (the options of the multi-node report), or None on one node."""
    if nnodes is None and node_rank is None and rdzv_endpoint is None and rdzv_id is None:
        return None  # never from SLURM_* alone: an attach inside an allocation stays local
    from torchdoctor.distributed.multinode import resolve

    if nnodes is None:
        raise DoctorError("--node-rank, --rdzv-endpoint and --rdzv-id need --nnodes")
    if not job:
        raise DoctorError("--nnodes needs --job: every node attaches to its own ranks of the job",
                          "torchdoctor attach --job --nnodes N --node-rank K --rdzv-endpoint HOST:PORT")
    return resolve(nnodes, node_rank, rdzv_endpoint, None, rdzv_id, None, None, env={})


def register(app: typer.Typer) -> None:
    @app.command(help=HELP)
    @guarded
    def attach(
        pids: Annotated[Optional[list[int]], typer.Argument(
            help="Process IDs (with --job: the launcher's or one rank's, optional).",
            show_default=False)] = None,
        job: Annotated[bool, typer.Option("--job", help="Attach to every local rank of a torchrun job.")] = False,
        duration: Annotated[float, typer.Option("--duration", help="Seconds to sample.")] = 10.0,
        timeout: Annotated[Optional[float], typer.Option(
            "--timeout", help="Bound on the whole attach in seconds (default: duration + 60).")] = None,
        nonblocking: Annotated[bool, typer.Option(
            "--nonblocking", help="Never pause the target while reading (a stack may be torn).")] = False,
        native: Annotated[bool, typer.Option("--native", help="Include native (C/C++) frames.")] = False,
        no_flight_recorder: Annotated[bool, typer.Option(
            "--no-flight-recorder", help="Do not ask the ranks for a Flight Recorder dump.")] = False,
        nnodes: Annotated[Optional[int], typer.Option(
            "--nnodes", metavar="N", show_default=False,
            help="Nodes of the job: run attach --job on every node; node 0 prints the job report.")] = None,
        node_rank: Annotated[Optional[int], typer.Option(
            "--node-rank", metavar="K", show_default=False,
            help="This node's rank among the attaching nodes (0 prints the job report).")] = None,
        rdzv_endpoint: Annotated[Optional[str], typer.Option(
            "--rdzv-endpoint", metavar="HOST:PORT", show_default=False,
            help="Node 0's host and a port; the job report is gathered on PORT+1 "
                 "(TORCHDOCTOR_GATHER_PORT overrides it).")] = None,
        rdzv_id: Annotated[Optional[str], typer.Option(
            "--rdzv-id", metavar="ID", show_default=False,
            help="An id shared by the attaching nodes (default torchdoctor).")] = None,
        out: Annotated[Optional[str], typer.Option(
            "--out", help="Also write report.json/report.txt/the HTML and the raw evidence here.")] = None,
        as_json: JsonOpt = False,
        fail_on: FailOnOpt = "error",
        html: HtmlOpt = None,
        sarif: SarifOpt = None,
        junit: JunitOpt = None,
    ) -> None:
        import json
        import sys
        from pathlib import Path

        from torchdoctor.commands._common import check_fail_on, eprint, prepare_html, prepare_out

        check_fail_on(fail_on)
        if not 0 < duration <= MAX_DURATION_S:
            raise DoctorError(f"--duration must be in (0, {MAX_DURATION_S:g}] seconds, not {duration:g}")
        bound = duration + 60.0 if timeout is None else timeout
        if bound < duration:
            raise DoctorError(f"--timeout ({bound:g} s) is shorter than --duration ({duration:g} s)")
        if native and nonblocking:
            raise DoctorError("--native needs to pause the target while it reads (py-spy cannot "
                              "unwind native frames without it): drop --nonblocking or --native")
        if sys.platform != "linux":
            raise DoctorError("attach reads /proc and needs Linux", "run it on the machine of the job")
        out = prepare_out(out)
        html_path = prepare_html(html, out)
        from torchdoctor.commands._common import prepare_outputs

        outputs = prepare_outputs(sarif=sarif, junit=junit)
        from torchdoctor.attach.report import build_report
        from torchdoctor.attach.sampler import require_pyspy
        from torchdoctor.attach.session import collect

        import time

        started = time.monotonic()
        node = _node(nnodes, node_rank, rdzv_endpoint, rdzv_id, job)
        require_pyspy()
        targets, facts, label = _targets(list(pids or []), job)
        where = f" (node {node.node_rank} of {node.nnodes})" if node is not None else ""
        eprint(f"torchdoctor attach: {label}{where}: sampling for {duration:g} s (bound {bound:g} s)")
        ev = collect(targets, duration, bound, nonblocking=nonblocking, native=native,
                     flight_recorder=not no_flight_recorder, job=facts)
        if node is not None:
            from torchdoctor.attach.nodes import run as run_nodes

            if node.node_rank == 0:
                eprint(f"torchdoctor attach: waiting for {node.nnodes - 1} other node(s) on port "
                       f"{node.gather_port()}")
            report = run_nodes(ev, node, label, started + bound)
        else:
            report = build_report(ev, label)
        if out is not None:
            from torchdoctor.runner.outdir import write_file

            write_file(Path(out) / "attach-evidence.json", json.dumps(ev, default=str) + "\n")
            report.artifacts["evidence"] = str(Path(out) / "attach-evidence.json")
        emit(report, as_json, fail_on, out, html=html_path, outputs=outputs)
