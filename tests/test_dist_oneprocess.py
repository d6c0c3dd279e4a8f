"""Plain repro on a ranked script (issue 29 item 3): it runs the script in one process, so
``--nproc-per-node N`` is refused before any run, with the reasons and what to run instead
(torchdoctor/distributed/oneprocess.py). Before, the option was taken for the script ("script not
found: --nproc-per-node"). ``repro --resume-check --nproc-per-node N`` runs (the resume check on N
ranks: tests/test_repro_dcp.py); a bad N is refused there too. treat was refused here too until it
ran its trials on N ranks (issue 29 item 4: tests/test_treat_ranked.py)."""

from __future__ import annotations

import pytest

from conftest import ROOT

SCRIPT = ROOT / "tests" / "fixtures" / "scripts" / "dist" / "fsdp2_nan.py"


@pytest.mark.parametrize("argv", [["repro"]])
def test_ranked_one_process_commands_refuse_with_the_reasons(argv, tmp_path, cli_inproc):
    # in-process, any run forbidden (conftest): refused before anything runs
    p = cli_inproc(*argv, "--nproc-per-node", 2, "--out", tmp_path / "out", SCRIPT)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = " ".join(p.stderr.split())
    assert "script not found" not in err and "Traceback" not in err, err
    assert f"{argv[0]} runs the script in one process: --nproc-per-node 2 is not supported" in err
    assert "hint: Instead:" in err
    assert "step by step" in err and "What runs on N ranks is the resume check" in err
    assert "repro --resume-check --nproc-per-node N SCRIPT" in err
    assert p.stdout == ""
    assert not (tmp_path / "out").exists()  # refused before anything was prepared or run


def test_treat_help_offers_ranked_trials_and_repro_help_the_refused_option():
    from conftest import run_main

    p = run_main("treat", "--help")  # in-process: a help text needs no child
    assert p.returncode == 0 and "--nproc-per-node" in p.stdout
    text = " ".join(p.stdout.split())
    assert "Not supported" not in text and "timed on the slowest rank" in text


def test_repro_resume_check_on_zero_ranks_is_a_clear_error(tmp_path, cli_inproc):
    p = cli_inproc("repro", "--resume-check", "--nproc-per-node", 0, "--out", tmp_path / "out", SCRIPT)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "--nproc-per-node must be >= 1, not 0" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "out").exists()


def test_repro_help_says_where_nproc_per_node_applies():
    from conftest import run_main

    p = run_main("repro", "--help")
    text = " ".join(p.stdout.split())
    assert p.returncode == 0 and "With --resume-check: run the script on N ranks under torchrun" in text
