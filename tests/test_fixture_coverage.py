"""Every declared finding code has a sick fixture that raises it, or a stated reason why not.

A code counts as covered when:
- a fixture script's `# expect:` header names it (tests/test_fixtures.py checks that the fixture
  really raises it: on CPU here, on the GPU box for `# requires: cuda` fixtures), or
- a checkpoint fixture's expectation (tests/golden/checkpoint/*.expect.json, made from
  tests/fixtures/checkpoint/builders.py EXPECTED and compared by tests/test_fixtures.py) raises it.
Everything else must be in NO_SICK_FIXTURE with the reason and the test that covers it instead.
"""

from __future__ import annotations

import json

from fixture_runs import GOLDEN, headed_fixtures
from torchdoctor.catalog import catalog

NO_SICK_FIXTURE = {
    # checkpoint codes raised only with options or on other inputs (their own test files)
    "ckpt-model-mismatch": "needs --model MODULE:FACTORY: tests/test_checkpoint_model.py",
    "ckpt-part-file": "one file of a multi-file layout: tests/test_checkpoint_parts.py",
    # environment report (`env`): judged from a recorded machine, not a script
    "gpu-memory-in-use": "env on a busy GPU host: tests/fixtures/env/h100_busy.json in tests/test_env.py",
    "nccl-env-risky": "dist-env check of risky NCCL_* variables: tests/test_dist_env.py",
    "nccl-unavailable": "dist-env on a GPU host whose torch lacks NCCL: tests/test_dist_env.py",
    "tf32-disabled": "env of a GPU host (TF32 flags): tests/fixtures/env/h100.json in tests/test_env.py",
    "torch-cpu-build-on-gpu-host": "env: a CPU torch on a host with GPUs: tests/test_env.py",
    # `dist` self-test (no user script) and launch environment
    "collective-selftest-failed": "dist self-test worker failing: tests/test_dist_selftest.py",
    "allreduce-bandwidth-low": "dist self-test bandwidth on GPUs (NCCL): tests/test_dist_selftest.py",
    "collectives-exposed": "judged on CUDA (NCCL) only: the rule on synthetic tables in "
                           "tests/test_dist_comm.py, the NCCL FSDP2 run there with -m multigpu",
    "dist-env-inconsistent": "launch environment of the ranks: tests/test_dist_env.py",
    # multi-node jobs: two torchdoctor agents, which a fixture header (one command) cannot start
    "node-env-mismatch": "two simulated nodes, one with TORCH_DISTRIBUTED_DEBUG: tests/test_multinode_e2e.py",
    "node-never-joined": "a node that never starts: tests/test_multinode_e2e.py",
    "node-lost": "a node that sends no report: tests/test_multinode.py (synthetic)",
    "node-summary-invalid": "a hostile agent on node 0's gather port: tests/test_multinode_hostile.py",
    "inter-node-sockets": "NCCL transport lines of a multi-node self-test: tests/test_multinode.py",
    # `attach` on a running job (a PID, not a script a fixture header can run)
    "rank-waited-for": "attach, a rank still moving while the others wait: tests/test_attach_rules.py",
    "rank-spinning": "attach on a real job, tests/fixtures/attach/spin_rank.py: tests/test_attach.py",
    "gil-held-by-thread": "attach on a real process, tests/fixtures/attach/gil_thread.py: tests/test_attach.py",
    "dataloader-worker-stuck": "attach, a stuck worker under a waiting rank: tests/test_attach_rules.py",
    "live-memory-growth": "attach on a real process, tests/fixtures/attach/leak_steps.py: tests/test_attach.py",
    "host-sync-stall": "attach on a GPU process, tests/fixtures/attach/host_sync_stall.py (gpu): tests/test_attach.py",
    # a bug of torchdoctor itself, by construction not raised by any healthy code path
    "internal-error": "a crashing rule (planted by tests): tests/test_profile_rules.py, test_env.py, test_checkpoint_hostile.py",
}


def _covered() -> dict[str, list[str]]:
    by: dict[str, list[str]] = {}
    for h in headed_fixtures():
        for e in h.expect:
            by.setdefault(e.split("@")[0], []).append(h.rel)
    for p in sorted((GOLDEN / "checkpoint").glob("*.expect.json")):
        for f in json.loads(p.read_text())["findings"]:
            by.setdefault(f["code"], []).append(f"checkpoint/{p.name[:-len('.expect.json')]}")
    return by


def test_every_code_has_a_sick_fixture_or_a_stated_reason():
    codes = set(catalog())
    covered = _covered()
    missing = codes - set(covered) - set(NO_SICK_FIXTURE)
    assert not missing, f"codes without a sick fixture (add one, or a reason to NO_SICK_FIXTURE): {sorted(missing)}"


def test_no_sick_fixture_table_is_current():
    codes = set(catalog())
    covered = set(_covered())
    assert set(NO_SICK_FIXTURE) <= codes, f"not declared: {sorted(set(NO_SICK_FIXTURE) - codes)}"
    assert not set(NO_SICK_FIXTURE) & covered, f"now covered by a fixture: {sorted(set(NO_SICK_FIXTURE) & covered)}"


def test_expect_headers_name_declared_codes_and_severities():
    info = catalog()
    for h in headed_fixtures():
        for e in h.expect:
            code, _, sev = e.partition("@")
            assert code in info, f"{h.rel}: unknown code {code!r}"
            assert sev in ("error", "warning", "info"), f"{h.rel}: {e!r} needs code@severity"
