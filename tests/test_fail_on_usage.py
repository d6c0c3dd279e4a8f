"""`--fail-on` is checked before any work, on every command (regression: demo, env,
checkpoint-audit and the dist self-test ran to the end, then exited 2)."""

import pytest
from typer.testing import CliRunner

from torchdoctor.cli import app


def _forbid(monkeypatch, target: str):
    def ran(*a, **k):
        raise AssertionError(f"{target} ran before --fail-on was checked")

    monkeypatch.setattr(target, ran)


@pytest.mark.parametrize("argv, work", [
    (["demo", "--fail-on", "bogus"], "torchdoctor.pipeline.run.run_probe"),
    (["env", "--fail-on", "bogus"], "torchdoctor.envinfo.collect"),
    (["checkpoint-audit", "PLACEHOLDER", "--fail-on", "bogus"], "torchdoctor.pipeline.checkpoint.run"),
    (["dist", "--fail-on", "bogus"], "torchdoctor.pipeline.dist.run_dist"),
])
def test_bad_fail_on_is_exit_2_before_any_work(monkeypatch, tmp_path, argv, work):
    _forbid(monkeypatch, work)
    f = tmp_path / "ok.pt"
    f.write_bytes(b"x")
    argv = [str(f) if a == "PLACEHOLDER" else a for a in argv]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "--fail-on must be" in res.output
