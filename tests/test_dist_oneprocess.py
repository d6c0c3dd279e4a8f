"""repro (with --resume-check) and treat on a ranked script (issue 29 items 3 and 4): both run the
script in one process, so ``--nproc-per-node N`` is refused before any run, with the reasons and
what to run instead (torchdoctor/distributed/oneprocess.py). Before, the option was taken for the
script ("script not found: --nproc-per-node")."""

from __future__ import annotations

import pytest

from conftest import ROOT

SCRIPT = ROOT / "tests" / "fixtures" / "scripts" / "dist" / "fsdp2_nan.py"


@pytest.mark.parametrize("argv", [["repro", "--resume-check"], ["repro"], ["treat"]])
def test_ranked_one_process_commands_refuse_with_the_reasons(argv, tmp_path, cli_inproc):
    # in-process, any run forbidden (conftest): refused before anything runs
    p = cli_inproc(*argv, "--nproc-per-node", 2, "--out", tmp_path / "out", SCRIPT)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    err = " ".join(p.stderr.split())
    assert "script not found" not in err and "Traceback" not in err, err
    assert f"{argv[0]} runs the script in one process: --nproc-per-node 2 is not supported" in err
    assert "hint: Instead:" in err and "profile --nproc-per-node N" in err
    if argv[0] == "repro":
        assert "DCP saves" in err and "checkpoint-audit DIR" in err
    else:
        assert "MixedPrecisionPolicy" in err and "bucket_cap_mb" in err and "compile per FSDP2 block" in err
    assert p.stdout == ""
    assert not (tmp_path / "out").exists()  # refused before anything was prepared or run


def test_treat_help_names_the_refused_option():
    from conftest import run_main

    p = run_main("treat", "--help")  # in-process: a help text needs no child
    assert p.returncode == 0 and "--nproc-per-node" in p.stdout
    assert "Not supported" in " ".join(p.stdout.split())
