"""``dist`` through the pipeline: the collective self-test's report, and a script under torchrun.

* :func:`run_dist` (``torchdoctor dist`` without SCRIPT): gather -> judge -> self-test -> judge
  -> Report. Measurement (facts, topology, self-test) stays in ``torchdoctor/distributed/`` and
  judgment in the rules of probes ``dist-env`` (rules/dist_env.py, rules/dist_nccl_env.py) and
  ``dist-selftest`` (rules/dist_selftest.py), applied by the guarded ``judge()``; this module
  builds their evidence (distributed/evidence.py), wires them and fills ``report.metrics["dist"]``.
* :func:`run_script` (``torchdoctor dist SCRIPT``): the script probe ``dist`` on
  ``options.nproc_per_node`` ranks (:func:`default_nproc` when the command was given none),
  through :func:`torchdoctor.pipeline.run.run_probe`: one report merged across ranks.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from torchdoctor.distributed.probe import DistOptions
from torchdoctor.errors import DoctorError
from torchdoctor.findings import Report
from torchdoctor.pipeline.options import RunOptions


def default_nproc() -> int:
    """Ranks for a script when --nproc-per-node is not given: one per GPU, else 2 (gloo)."""
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        n = 0
    return n if n >= 1 else 2


def run_script(target: str, args: list[str], options: RunOptions) -> Report:
    """``torchdoctor dist SCRIPT``: the script probe ``dist`` under torchrun, merged report."""
    from torchdoctor.pipeline.run import run_probe

    if options.nproc_per_node is None:
        options = options.replace(nproc_per_node=default_nproc())
    return run_probe("dist", target, args, options)


def run_dist(opts: DistOptions) -> Report:
    from torchdoctor.distributed import selftest, topology
    from torchdoctor.distributed.evidence import LaunchEvidence, SelftestEvidence
    from torchdoctor.distributed.facts import gather_facts
    from torchdoctor.distributed.probe import choose_backend, choose_nproc, env_view, topology_summary
    from torchdoctor.judge import judge

    env = dict(os.environ)
    facts = gather_facts(env)
    if not facts.get("torch"):
        raise DoctorError("torch cannot be imported", hint=facts.get("torch_error"))
    backend = choose_backend(opts, facts)
    nproc = choose_nproc(opts, backend, facts)
    topo = topology.gather_topology()
    report = Report(command="dist", context=default_context())
    report.target = f"local node, {nproc} rank(s), {backend}"
    if opts.node is not None:
        report.target = (f"node {opts.node.node_rank} of {opts.node.nnodes}, {nproc} rank(s) each, "
                         f"{backend}")
    judge("dist-env", LaunchEvidence(env, facts, topo), report)
    dist_metrics: dict = {"torch": facts.get("torch"), "backends": facts.get("backends"),
                          "nccl_version": facts.get("nccl_version"),
                          "cuda_devices": facts.get("cuda_device_count"), "host": facts.get("host"),
                          **env_view(env), "topology": topology_summary(topo)}
    report.metrics["dist"] = dist_metrics
    if not opts.selftest:  # skipped under the names of the dist-selftest rules
        report.skip("collective-selftest", "--no-selftest")
        report.skip("allreduce-bandwidth-low", "--no-selftest")
        return report
    if not facts.get("dist_available"):
        report.skip("collective-selftest", "torch.distributed is not available")
        return report
    tmp = None
    if opts.out_dir:
        from torchdoctor.runner.outdir import fresh_subdir

        out = fresh_subdir(opts.out_dir, "dist-selftest")
    else:
        tmp = tempfile.mkdtemp(prefix="torchdoctor-dist-")
        out = Path(tmp)
    try:
        timeout = opts.timeout_s or (180.0 if backend == "nccl" else 60.0)
        extra = {"node": opts.node} if opts.node is not None else {}
        st = selftest.run_selftest(nproc, out, backend=backend, sizes=opts.sizes, timeout_s=timeout,
                                   **extra)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if opts.out_dir:
        report.artifacts["dist_selftest"] = str(out)
    used = None
    if backend == "nccl":
        devs = [r.get("device") or {} for r in st.get("ranks", [])]
        bus = [f"{d['pci']['domain']:04x}:{d['pci']['bus']:02x}:{d['pci']['device']:02x}.0"
               if d.get("pci") else None for d in devs]
        used = topology.select_gpus(topo, [d.get("uuid") for d in devs], bus, nproc)
    capacity = topology.link_capacity(topo, used)
    if opts.node is not None and opts.node.nnodes > 1:
        capacity = {}  # the job-wide sweep crosses the network: not judged against local links
    judge("dist-selftest", SelftestEvidence(st, capacity), report)
    if st.get("status") == "interrupted":
        report.run_status = "interrupted"
        report.metrics["run"] = {"outcome": "interrupted", "interrupted_by": st.get("interrupted_by"),
                                 "wall_s": st.get("wall_s")}
    dist_metrics["link_capacity"] = capacity
    dist_metrics["selftest"] = {k: v for k, v in st.items()
                                if k != "log_tail" and not (tmp and k == "log")}
    for r in dist_metrics["selftest"].get("ranks", []):
        r.pop("error_full", None)
        r.pop("stack", None)
    return report


def default_context() -> dict:
    """Header facts of the ``dist`` report: python, torch version, device (imports torch)."""
    import platform

    ctx = {"python": platform.python_version()}
    try:
        import torch

        ctx["torch"] = torch.__version__
        if torch.cuda.is_available():
            ctx["device"] = f"cuda ({torch.cuda.get_device_name(0)})"
        else:
            ctx["device"] = "cpu"
    except Exception as e:  # noqa: BLE001
        ctx["torch"] = f"unavailable ({type(e).__name__})"
    return ctx
