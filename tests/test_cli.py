"""CLI behaviour: no traceback for bad input, exit codes, help."""


def test_help_works(cli):
    r = cli("--help")
    assert r.returncode == 0 and "Usage" in r.stdout


def test_unknown_command_exits_2_without_traceback(cli):
    r = cli("no-such-command")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr + r.stdout


def test_explain_prints_the_page(cli):
    r = cli("explain", "tf32-disabled")
    assert r.returncode == 0
    assert "What it means" in r.stdout


def test_explain_unknown_code_suggests_near_matches(cli):
    r = cli("explain", "tf32-disable")
    assert r.returncode == 2
    assert "unknown finding code" in r.stderr and "tf32-disabled" in r.stderr
    assert "Traceback" not in r.stderr


def test_explain_list(cli):
    r = cli("explain", "--list")
    assert r.returncode == 0 and "tf32-disabled" in r.stdout


def test_version(cli):
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("torchdoctor ")
