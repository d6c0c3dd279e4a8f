"""The error knowledge base: coverage, exact wording against installed torch, real errors, numbers."""

from __future__ import annotations

import json
import mmap
from collections import Counter
from pathlib import Path

import pytest

from torchdoctor.skills import ALL_SKILLS
from torchdoctor.errortext.table import BY_ID, KNOWN, TABLE
from torchdoctor.triage.logscan import scan
from torchdoctor.errortext.numbers import EXTRACTORS, human, oom, oom_notes

FIX = Path(__file__).parent / "fixtures" / "ask"


def _torch_root() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    return Path(spec.origin).parent if spec and spec.origin else None


def test_at_least_60_entries_over_every_area():
    assert len(KNOWN) >= 60
    assert len(BY_ID) == len(TABLE)  # unique ids (ask rows and the rules' rows)
    per_skill = Counter(k.skill for k in KNOWN)
    assert set(per_skill) == set(ALL_SKILLS)
    areas = {"cuda": "cuda", "nccl": "nccl", "dataloader": "dataloader", "compile": "_dynamo",
             "serialization": "serialization"}
    blob = " ".join(f"{k.id} {k.source} {k.sample}".lower() for k in KNOWN)
    for area, word in areas.items():
        assert word in blob, area


@pytest.mark.parametrize("k", KNOWN, ids=[k.id for k in KNOWN])
def test_entry_is_well_formed_and_its_sample_routes_to_it(k):
    assert k.key == k.key.lower() and k.key in k.sample.lower()
    assert k.severity in ("error", "warning")
    assert k.numbers is None or k.numbers in EXTRACTORS
    assert k.source.split(":", 1)[0] in ("py", "so", "ext")
    assert k.explain.strip() and k.first.strip() and k.title.strip()
    sc = scan(k.sample)
    assert sc.decisive is not None and sc.decisive.entry is k, (sc.decisive and sc.decisive.entry)


def test_python_needles_are_verbatim_in_installed_torch():
    root = _torch_root()
    if root is None:
        pytest.skip("torch not installed")
    missing = []
    for k in KNOWN:
        kind, _, rel = k.source.partition(":")
        if kind != "py":
            continue
        path = root / rel
        if not path.is_file() or k.needle not in path.read_text(errors="replace"):
            missing.append((k.id, rel))
    assert not missing, missing


@pytest.mark.slow
def test_library_needles_are_in_torchs_shared_libraries():
    root = _torch_root()
    if root is None:
        pytest.skip("torch not installed")
    missing = []
    libs: dict[str, mmap.mmap] = {}
    try:
        for k in KNOWN:
            kind, _, lib = k.source.partition(":")
            if kind != "so":
                continue
            path = root / "lib" / lib
            if not path.is_file():
                pytest.skip(f"{lib} not in this torch build")
            if lib not in libs:
                f = open(path, "rb")
                libs[lib] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if libs[lib].find(k.needle.encode()) < 0:
                # fall back to any torch library: strings move between libraries across versions
                if not any(m.find(k.needle.encode()) >= 0 for m in libs.values()):
                    missing.append((k.id, lib))
    finally:
        for m in libs.values():
            m.close()
    assert not missing, missing


def test_real_errors_from_installed_torch_are_recognised():
    """tests/fixtures/ask/make_real_errors.py triggered these on CPU with the real torch."""
    rows = [json.loads(line) for line in (FIX / "real_errors.jsonl").read_text().splitlines() if line]
    assert len(rows) >= 60
    wrong = []
    for r in rows:
        d = scan(r["text"]).decisive
        got = d.entry.id if d is not None and d.entry is not None else None
        if got != r["expect"]:
            wrong.append((r["expect"], got, r["text"][:120]))
    assert not wrong, wrong


def test_oom_numbers_new_format():
    n = oom(BY_ID["cuda-oom"].sample)
    assert n["requested_bytes"] == 2 * 2**30
    assert n["capacity_bytes"] == round(79.11 * 2**30)
    assert n["free_bytes"] == round(1.50 * 2**30)
    assert n["allocated_bytes"] == round(75.20 * 2**30)
    assert n["reserved_bytes"] == round(75.20 * 2**30) + round(1.10 * 2**30)
    assert n["process_in_use_bytes"] == round(77.59 * 2**30)
    assert n["gpu"] == 0
    notes = " ".join(oom_notes(n))
    assert "requested 2.00 GiB with 1.50 GiB free" in notes
    assert "fragmentation" not in notes  # 1.10 GiB unallocated < 2.00 GiB requested


def test_oom_numbers_old_format_and_other_processes():
    n = oom("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
            "14.50 GiB already allocated; 3.44 MiB free; 14.64 GiB reserved in total by PyTorch)")
    assert n["requested_bytes"] == 20 * 2**20 and n["free_bytes"] == round(3.44 * 2**20)
    assert n["allocated_bytes"] == round(14.50 * 2**30) and n["reserved_bytes"] == round(14.64 * 2**30)
    n = oom("CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 14.57 GiB of which "
            "1.58 GiB is free. Process 2493055 has 12.02 GiB memory in use. Including non-PyTorch memory, this "
            "process has 966.00 MiB memory in use. Of the allocated memory 734.07 MiB is allocated by PyTorch, "
            "and 33.93 MiB is reserved by PyTorch but unallocated.")
    assert n["other_processes"] == [{"pid": 2493055, "bytes": round(12.02 * 2**30)}]
    assert any("other processes hold 12.02 GiB" in s for s in oom_notes(n))


def test_fragmentation_note_only_when_the_request_would_fit_in_the_unallocated_reserve():
    n = oom("CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 80.00 GiB of which "
            "500.00 MiB is free. Of the allocated memory 70.00 GiB is allocated by PyTorch, and 8.00 GiB is "
            "reserved by PyTorch but unallocated.")
    assert any("fragmentation" in s for s in oom_notes(n))


def test_other_numbers():
    d = scan(BY_ID["nccl-watchdog-timeout"].sample).decisive
    assert d.numbers == {"seq": 57, "op": "ALLREDUCE", "numel_in": 1048576, "numel_out": 1048576,
                         "timeout_ms": 600000, "ran_ms": 600059, "rank": 0}
    assert scan(BY_ID["cpu-alloc-failed"].sample).decisive.numbers == {"requested_bytes": 274877906944}
    assert scan(BY_ID["matmul-shapes"].sample).decisive.numbers == {"m1": "64x2048", "m2": "512x10"}
    assert scan(BY_ID["nccl-error"].sample).decisive.numbers["nccl_version"] == "2.26.2"
    sd = scan(BY_ID["state-dict-keys"].sample).decisive.numbers
    assert sd["key_prefixes"] == ["module."] and sd["unexpected_keys"] == 1


def test_human_sizes():
    assert human(2 * 2**30) == "2.00 GiB" and human(512) == "512 B" and human(3 * 2**20) == "3.00 MiB"
