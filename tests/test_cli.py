"""CLI behaviour: no traceback for bad input, exit codes, help. `--help` and `--version` go
through a real process (the console entry point); the rest runs the same entry point in this
process (conftest run_main): nothing of it depends on being a separate process."""


def test_help_works(cli):
    r = cli("--help")
    assert r.returncode == 0 and "Usage" in r.stdout


def test_unknown_command_exits_2_without_traceback(cli_inproc):
    r = cli_inproc("no-such-command")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr + r.stdout


def test_explain_prints_the_page(cli_inproc):
    r = cli_inproc("explain", "tf32-disabled")
    assert r.returncode == 0
    assert "What it means" in r.stdout


def test_explain_unknown_code_suggests_near_matches(cli_inproc):
    r = cli_inproc("explain", "tf32-disable")
    assert r.returncode == 2
    assert "unknown finding code" in r.stderr and "tf32-disabled" in r.stderr
    assert "Traceback" not in r.stderr


def test_explain_list(cli_inproc):
    r = cli_inproc("explain", "--list")
    assert r.returncode == 0 and "tf32-disabled" in r.stdout


def test_version(cli):
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("torchdoctor ")
