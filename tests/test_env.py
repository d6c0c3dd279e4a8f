"""`torchdoctor env`: bounded collectors, pure rules, console/JSON output, the saved H100 report."""

import copy
import json
import re
import subprocess
import sys
import time

import pytest

from conftest import FIXTURES, ROOT
from torchdoctor.envinfo import nvml, system
from torchdoctor.rules.env import visible_gpus
from torchdoctor.envinfo.torchinfo import matmul_tf32_state
from torchdoctor.envinfo.runner import Collector, is_failed, run_collectors

H100 = FIXTURES / "env" / "h100.json"  # `env --json` on the H100 box (tests/fixtures/env/collect_h100.sh)
H100_BUSY = FIXTURES / "env" / "h100_busy.json"  # same box while another process held 20 GiB
GIB = 1024 ** 3


# ---------------------------------------------------------------- runner

def test_runner_turns_a_raise_into_could_not_collect():
    def boom():
        raise ValueError("disk on fire")

    res, _ = run_collectors([Collector("ok", lambda: {"a": 1}), Collector("bad", boom)])
    assert res["ok"] == {"a": 1}
    assert res["bad"] == {"error": "could not collect: ValueError: disk on fire"}
    assert is_failed(res["bad"]) and not is_failed(res["ok"])


def test_runner_bounds_a_hanging_collector_and_keeps_the_others():
    t0 = time.monotonic()
    res, timing = run_collectors([Collector("hang", lambda: time.sleep(30), timeout_s=0.2),
                                  Collector("fast", lambda: {"x": 2}, timeout_s=0.2)])
    wall = time.monotonic() - t0
    assert wall < 1.5, wall
    assert res["hang"] == {"error": "could not collect: timed out after 0.2 s"}
    assert res["fast"] == {"x": 2}
    assert timing["hang"] == 0.2


def test_collectors_run_concurrently():
    t0 = time.monotonic()
    res, _ = run_collectors([Collector(f"c{i}", lambda: time.sleep(0.3) or {}, 2.0) for i in range(4)])
    assert time.monotonic() - t0 < 1.0
    assert all(v == {} for v in res.values())


# ---------------------------------------------------------------- collectors

@pytest.mark.parametrize("fn", [system.python_info, system.os_info, system.cpu_info, system.memory_info,
                                system.env_vars, system.packages])
def test_host_collectors_return_json_able_dicts(fn):
    out = fn()
    assert isinstance(out, dict)
    json.dumps(out)


def test_memory_and_cpu_facts_are_plausible():
    m = system.memory_info()
    assert 0 < m["available_bytes"] <= m["total_bytes"]
    c = system.cpu_info()
    assert c["logical_cores"] >= 1


def test_env_vars_keeps_the_ones_that_matter_and_redacts_secrets():
    out = system.env_vars({"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "HOME": "/root",
                           "TORCH_HUB_TOKEN": "abc", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert out == {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO", "TORCH_HUB_TOKEN": "<redacted>",
                   "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_packages_reads_versions_without_importing():
    before = set(sys.modules)
    out = system.packages()
    assert out["related"]["torch"]  # the dev venv has torch
    assert "pytest" not in out["related"]
    assert not ({"torchvision", "transformers"} & (set(sys.modules) - before))


def test_torch_collectors_never_raise():
    from torchdoctor.envinfo import torchinfo

    b = torchinfo.torch_build()
    assert b["version"] and b["build"] in ("CPU",) or b["build"].startswith(("CUDA", "ROCm"))
    json.dumps(b)
    json.dumps(torchinfo.torch_cuda())
    f = torchinfo.torch_flags()
    assert f["matmul_tf32"] in (True, False, None)
    json.dumps(f)


def test_cudnn_and_driver_version_strings():
    from torchdoctor.envinfo.torchinfo import cudnn_version_str

    assert cudnn_version_str(8907) == "8.9.7"
    assert cudnn_version_str(91002) == "9.10.2"
    assert cudnn_version_str(None) is None
    assert nvml.cuda_driver_version_str(13000) == "13.0"
    assert nvml.cuda_driver_version_str(12040) == "12.4"


# ---------------------------------------------------------------- NVML with a fake library

class _NVMLError(Exception):
    pass


def _err(name):
    return type(name, (_NVMLError,), {})


class FakeNVML:
    """Enough of pynvml for nvml.nvidia(): GPU 1 hangs, anything not defined is NotSupported."""

    NVMLError = _NVMLError
    NVMLError_NotSupported = _err("NVMLError_NotSupported")
    NVMLError_LibraryNotFound = _err("NVMLError_LibraryNotFound")
    NVMLError_Unknown = _err("NVMLError_Unknown")
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, init_error=None, count=2, hang_index=1):
        self.init_error, self.count, self.hang_index = init_error, count, hang_index

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        pass

    def nvmlSystemGetDriverVersion(self):
        return "580.1"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        if i == self.hang_index:
            time.sleep(30)
        return i

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU"

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return []

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []

    def __getattr__(self, name):
        if name.startswith("NVML_"):
            return 0
        if name.startswith("nvml"):
            def unsupported(*a, **k):
                raise self.NVMLError_NotSupported("Not Supported")
            return unsupported
        raise AttributeError(name)


def test_nvidia_without_driver_says_so_plainly(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(init_error=FakeNVML.NVMLError_LibraryNotFound("x")))
    out = nvml.nvidia()
    assert out["present"] is False and "no NVIDIA driver" in out["reason"] and out["gpus"] == []


def test_nvidia_unexpected_init_error_raises_for_the_runner(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(init_error=FakeNVML.NVMLError_Unknown("x")))
    res, _ = run_collectors([Collector("nvidia", nvml.nvidia, 2.0)])
    assert res["nvidia"]["error"].startswith("could not collect: NVMLError_Unknown")


def test_a_hanging_gpu_costs_only_its_own_row(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    t0 = time.monotonic()
    out = nvml.nvidia(gpu_timeout_s=0.3)
    assert time.monotonic() - t0 < 2.0
    assert out["present"] and out["driver"] == "580.1" and out["cuda_driver"] == "13.0"
    g0, g1 = out["gpus"]
    assert g0["name"] == "Fake GPU" and g0["compute_capability"] == "9.0" and g0["processes"] == []
    assert g0["nvlink"] is None and g0["unavailable"]["nvlink"] == "not supported"
    assert g1 == {"index": 1, "error": "could not collect: timed out after 0.3 s"}


# ---------------------------------------------------------------- rules on synthetic evidence

def _gpu(index=0, used=0, total=80 * GIB, procs=None, cc="9.0", uuid=None):
    return {"index": index, "name": "NVIDIA H100 80GB HBM3", "uuid": uuid or f"GPU-{index}aaa",
            "compute_capability": cc, "memory": {"total_bytes": total, "used_bytes": used},
            "processes": procs if procs is not None else [], "unavailable": {}}


def _env(gpus=None, cuda="13.0", flags=None, env_vars=None, present=True):
    nv = ({"present": True, "driver": "580.159.04", "cuda_driver": "13.0", "gpu_count": len(gpus or []),
           "gpus": gpus or []} if present else
          {"present": False, "reason": "no NVIDIA driver found (libnvidia-ml.so is not installed)", "gpus": []})
    return {"torch": {"version": "2.11.0", "cuda": cuda, "hip": None, "build": "x"},
            "torch_flags": flags or {"matmul_tf32": False, "float32_matmul_precision": "highest"},
            "nvidia": nv, "env_vars": env_vars or {}}


def evaluate(env):
    """(findings, [(rule, reason skipped)]) of the env probe's rules, through the guarded judge."""
    from torchdoctor.pipeline.env import build_report

    report = build_report(env)
    return report.findings, [(s.rule, s.reason) for s in report.skipped]


def _codes(env):
    findings, skipped = evaluate(env)
    return sorted(f.code for f in findings), dict(skipped)


def test_no_driver_is_not_an_error_and_gpu_rules_are_skipped():
    codes, skipped = _codes(_env(present=False, cuda=None))
    assert codes == []
    assert "no NVIDIA driver" in skipped["gpu-memory-in-use"]
    assert "tf32-disabled" in skipped
    assert "torch-cpu-build-on-gpu-host" not in skipped  # judged: no GPU, nothing torch could use


def test_cpu_build_on_gpu_host_is_an_error():
    findings, _ = evaluate(_env(gpus=[_gpu()], cuda=None))
    f = [f for f in findings if f.code == "torch-cpu-build-on-gpu-host"]
    assert len(f) == 1 and f[0].severity == "error"
    assert "13.0" in f[0].fix and f[0].evidence["gpus"] == ["NVIDIA H100 80GB HBM3"]


def test_cuda_build_on_gpu_host_is_fine():
    assert "torch-cpu-build-on-gpu-host" not in _codes(_env(gpus=[_gpu()]))[0]


def test_other_process_holding_20_percent_is_a_warning():
    procs = [{"pid": 42, "name": "python", "type": "compute", "used_bytes": 16 * GIB, "self": False}]
    findings, _ = evaluate(_env(gpus=[_gpu(used=16 * GIB, procs=procs)]))
    f = [f for f in findings if f.code == "gpu-memory-in-use"]
    assert len(f) == 1 and f[0].severity == "warning"
    assert "GPU 0 16.0 of 80.0 GiB (20%)" in f[0].title
    assert f[0].evidence["gpus"][0]["processes"] == ["pid 42 python (16.00 GiB)"]


def test_below_threshold_or_own_process_is_not_flagged():
    small = [{"pid": 42, "name": "python", "type": "compute", "used_bytes": 7 * GIB, "self": False}]
    mine = [{"pid": 7, "name": "python", "type": "compute", "used_bytes": 40 * GIB, "self": True}]
    assert "gpu-memory-in-use" not in _codes(_env(gpus=[_gpu(used=7 * GIB, procs=small)]))[0]
    assert "gpu-memory-in-use" not in _codes(_env(gpus=[_gpu(used=40 * GIB, procs=mine)]))[0]


def test_memory_held_by_invisible_processes_still_counts():
    findings, _ = evaluate(_env(gpus=[_gpu(used=30 * GIB, procs=[])]))
    f = [f for f in findings if f.code == "gpu-memory-in-use"][0]
    assert "none visible" in str(f.evidence["gpus"][0]["processes"])


def test_busy_gpu_outside_cuda_visible_devices_is_ignored():
    busy = _gpu(0, used=60 * GIB)
    free = _gpu(1, used=0)
    assert "gpu-memory-in-use" in _codes(_env(gpus=[busy, free]))[0]
    assert "gpu-memory-in-use" not in _codes(_env(gpus=[busy, free], env_vars={"CUDA_VISIBLE_DEVICES": "1"}))[0]
    codes, skipped = _codes(_env(gpus=[busy, free], env_vars={"CUDA_VISIBLE_DEVICES": "7"}))
    assert "gpu-memory-in-use" in skipped


def test_visible_gpus_parses_indices_and_uuids_and_stops_at_an_invalid_entry():
    gpus = [_gpu(0), _gpu(1, uuid="GPU-abcdef"), _gpu(2)]
    assert [g["index"] for g in visible_gpus(gpus, None)] == [0, 1, 2]
    assert [g["index"] for g in visible_gpus(gpus, "2,0")] == [2, 0]
    assert [g["index"] for g in visible_gpus(gpus, "GPU-abc")] == [1]
    assert [g["index"] for g in visible_gpus(gpus, "1,bogus,0")] == [1]
    assert visible_gpus(gpus, "") == []


def test_tf32_off_on_hopper_is_info():
    findings, _ = evaluate(_env(gpus=[_gpu()]))
    f = [f for f in findings if f.code == "tf32-disabled"]
    assert len(f) == 1 and f[0].severity == "info"
    assert "set_float32_matmul_precision('high')" in f[0].fix


@pytest.mark.parametrize("flags,expected", [
    ({"matmul_fp32_precision": "tf32"}, True),
    ({"matmul_fp32_precision": "ieee", "matmul_allow_tf32": True}, False),
    ({"matmul_fp32_precision": "none", "matmul_allow_tf32": False, "float32_matmul_precision": "highest"}, False),
    ({"matmul_fp32_precision": "none", "matmul_allow_tf32": None, "float32_matmul_precision": "high"}, True),
    ({"matmul_allow_tf32": True}, True),
    ({}, None),
])
def test_matmul_tf32_state(flags, expected):
    assert matmul_tf32_state(flags) is expected


def test_tf32_rule_quiet_when_on_and_skipped_when_not_applicable():
    on = {"matmul_allow_tf32": True, "float32_matmul_precision": "high"}
    assert "tf32-disabled" not in _codes(_env(gpus=[_gpu()], flags=on))[0]
    codes, skipped = _codes(_env(gpus=[_gpu(cc="7.0")]))
    assert "tf32-disabled" not in codes and "compute capability" in skipped["tf32-disabled"]
    codes, skipped = _codes(_env(gpus=[_gpu()], flags={"error": "could not collect: timed out after 60 s"}))
    assert "tf32-disabled" in skipped and "timed out" in skipped["tf32-disabled"]


def test_failed_sections_make_rules_skip_not_guess():
    env = _env(gpus=[_gpu()])
    env["nvidia"] = {"error": "could not collect: timed out after 8 s"}
    env["torch"] = {"error": "could not collect: ImportError: libcudart.so.13"}
    codes, skipped = _codes(env)
    assert codes == [] and set(skipped) == {"torch-cpu-build-on-gpu-host", "gpu-memory-in-use", "tf32-disabled"}


def _break_rule(monkeypatch, name):
    """Make the registered rule ``name`` raise, as a bug in it would."""
    import dataclasses

    from torchdoctor import judge

    def broken(env):
        raise KeyError("oops")

    monkeypatch.setitem(judge._RULES, name, dataclasses.replace(judge.all_rules()[name], fn=broken))


def test_a_crashing_rule_becomes_an_internal_error_finding(monkeypatch):
    _break_rule(monkeypatch, "gpu-memory-in-use")
    findings, _ = evaluate(_env(gpus=[_gpu()]))
    assert "internal-error" in [f.code for f in findings]


def test_a_crashing_env_rule_keeps_the_rest_of_the_report_and_the_exit_code(monkeypatch):
    """`torchdoctor env` with a broken rule: the other rules, the metrics and the exit code stand."""
    from typer.testing import CliRunner

    from torchdoctor.cli import app

    env = json.loads(H100_BUSY.read_text())["metrics"]["env"]
    env["torch"] = {**env["torch"], "cuda": None}  # a CPU torch on this GPU host: an error finding
    monkeypatch.setattr("torchdoctor.envinfo.collect", lambda: copy.deepcopy(env))
    _break_rule(monkeypatch, "gpu-memory-in-use")
    res = CliRunner().invoke(app, ["env", "--json"])
    rep = json.loads(res.stdout)
    codes = sorted(f["code"] for f in rep["findings"])
    assert codes == ["internal-error", "torch-cpu-build-on-gpu-host"]
    [bug] = [f for f in rep["findings"] if f["code"] == "internal-error"]
    assert bug["evidence"]["rule"] == "gpu-memory-in-use" and "KeyError" in bug["title"]
    assert "oops" in bug["evidence"]["traceback"]
    assert [s["rule"] for s in rep["skipped"]] == ["tf32-disabled"]
    assert rep["metrics"]["env"]["nvidia"]["gpus"][0]["name"] == env["nvidia"]["gpus"][0]["name"]
    assert res.exit_code == 1  # the error finding's exit code; the internal-error is a warning
    env["torch"]["cuda"] = "13.0"  # no error finding left: the broken rule alone does not fail the run
    res = CliRunner().invoke(app, ["env", "--json"])
    assert res.exit_code == 0 and "internal-error" in res.stdout
    assert CliRunner().invoke(app, ["env", "--json", "--fail-on", "warning"]).exit_code == 1


# ---------------------------------------------------------------- report and rendering

def _h100_env():
    return json.loads(H100.read_text())["metrics"]["env"]


def _render(env):
    from torchdoctor.pipeline.env import build_report
    from torchdoctor.report.console import render_to_text

    report = build_report(env)
    return report, render_to_text(report, width=120)


def test_h100_fixture_renders_gpu_driver_and_nccl():
    env = _h100_env()
    gpu = env["nvidia"]["gpus"][0]
    report, text = _render(env)
    assert "H100" in gpu["name"] and gpu["name"] in text
    assert env["nvidia"]["driver"] in text
    assert env["torch"]["nccl"] and re.search(rf"NCCL +{re.escape(env['torch']['nccl'])}", text)
    assert re.search(rf"cuDNN +{re.escape(env['torch']['cudnn'])}", text)
    assert re.search(r"0 +NVIDIA H100 80GB HBM3 +9\.0 +\d+\.\d / 79\.6", text)
    assert report.context["device"].startswith("cuda (") and "H100" in report.context["device"]
    assert "could not collect" not in text


def test_h100_fixture_rules_follow_its_flags():
    env = _h100_env()
    report, _ = _render(env)
    codes = {f.code for f in report.findings}
    assert "torch-cpu-build-on-gpu-host" not in codes
    assert ("tf32-disabled" in codes) == (matmul_tf32_state(env["torch_flags"]) is False)
    on = copy.deepcopy(env)
    on["torch_flags"].update(matmul_fp32_precision="tf32")
    assert "tf32-disabled" not in {f.code for f in _render(on)[0].findings}
    off = copy.deepcopy(env)
    off["torch_flags"].update(matmul_fp32_precision="ieee")
    assert "tf32-disabled" in {f.code for f in _render(off)[0].findings}


def test_h100_busy_fixture_raises_gpu_memory_in_use_naming_the_holder():
    env = json.loads(H100_BUSY.read_text())["metrics"]["env"]
    holder = env["nvidia"]["gpus"][0]["processes"][0]
    report, text = _render(env)
    f = [f for f in report.findings if f.code == "gpu-memory-in-use"]
    assert len(f) == 1 and "GPU 0 20.5 of 79.7 GiB (26%)" in f[0].title
    assert f"pid {holder['pid']} python3" in text
    assert report.exit_code() == 0 and report.exit_code("warning") == 1
    assert "gpu-memory-in-use" not in {f.code for f in _render(_h100_env())[0].findings}  # idle: quiet


def test_h100_fixture_with_a_cpu_torch_is_an_error():
    env = copy.deepcopy(_h100_env())
    env["torch"].update(cuda=None, nccl=None, cudnn=None, build="CPU")
    env["torch_cuda"] = {"available": False, "device_count": 0, "arch_list": [], "reason": "torch is a CPU build"}
    report, text = _render(env)
    codes = {f.code for f in report.findings}
    assert "torch-cpu-build-on-gpu-host" in codes and "tf32-disabled" not in codes
    assert "cpu (torch cannot use the 1 GPU present)" == report.context["device"]
    assert report.exit_code() == 1


def test_sections_draw_nothing_without_env_metrics():
    from torchdoctor.findings import Report
    from torchdoctor.report.console import render_to_text

    text = render_to_text(Report(command="profile"))
    assert "PyTorch" not in text and "GPUs" not in text


def test_a_failed_section_shows_could_not_collect():
    env = _h100_env()
    env = copy.deepcopy(env)
    env["nvidia"] = {"error": "could not collect: timed out after 8 s"}
    env["packages"] = {"error": "could not collect: OSError: boom"}
    _, text = _render(env)
    assert "could not collect: timed out after 8 s" in text and "could not collect: OSError: boom" in text


# ---------------------------------------------------------------- CLI on this box

def _has_nvidia_driver():
    try:
        import pynvml

        pynvml.nvmlInit()
        return True
    except Exception:
        return False


def test_cli_env_console_and_json_exit_0_within_3_s(cli):
    walls = []
    t0 = time.monotonic()
    r = cli("env")
    walls.append(time.monotonic() - t0)
    assert r.returncode in (0, 1), r.stderr
    assert "PyTorch" in r.stdout and "Traceback" not in r.stderr + r.stdout
    t0 = time.monotonic()
    rj = cli("env", "--json")
    walls.append(time.monotonic() - t0)
    data = json.loads(rj.stdout)
    env = data["metrics"]["env"]
    assert data["command"] == "env"
    assert {"python", "os", "cpu", "memory", "torch", "torch_cuda", "torch_flags", "nvidia", "env_vars",
            "packages", "warnings", "timing_s"} <= set(env)
    assert data["context"]["python"] and data["context"]["torch"]
    if not _has_nvidia_driver():  # the CPU CI box: no GPU is not an error
        assert r.returncode == 0 and rj.returncode == 0 and data["status"] == "ok"
        assert env["nvidia"]["present"] is False
        assert "no NVIDIA driver found" in r.stdout and "No problems found" in r.stdout
    # acceptance: < 3 s on the quiet CPU box, where `import torch` alone takes ≈ 1.5 s. On a loaded box
    # everything slows alike, so the budget scales with how long importing torch takes right now.
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, timeout=120)
    import_torch_s = time.monotonic() - t0
    budget = 3.0 * max(1.0, import_torch_s / 1.5)
    assert min(walls) < budget, (walls, import_torch_s)


def test_summary_context_is_cheap_and_does_not_import_torch():
    code = ("import json, sys, time; t=time.perf_counter(); from torchdoctor.envinfo import summary_context; "
            "c=summary_context(); print(json.dumps([c, 'torch' in sys.modules, time.perf_counter()-t]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    ctx, imported, secs = json.loads(r.stdout)
    assert not imported
    assert ctx["python"] and ctx["torch"] and ctx["device"]
    assert secs < 1.0, secs


@pytest.mark.gpu
def test_env_on_a_gpu_lists_gpu_driver_and_nccl(cli):
    r = cli("env", "--json")
    data = json.loads(r.stdout)
    env = data["metrics"]["env"]
    assert env["nvidia"]["present"] and env["nvidia"]["driver"]
    assert env["nvidia"]["gpus"][0]["name"] and env["torch"]["nccl"]
    assert env["torch_cuda"]["available"] is True
    assert "torch-cpu-build-on-gpu-host" not in {f["code"] for f in data["findings"]}
