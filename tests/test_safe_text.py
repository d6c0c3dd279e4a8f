"""Untrusted strings are shown with their control bytes visible and never parsed as markup."""

from torchdoctor.findings import Finding, Report
from torchdoctor.report.console import render_to_text
from torchdoctor.safe import has_controls, safe_text, visible


def test_visible_escapes_c0_c1_and_del():
    assert visible("a\x1b[1Ab") == "a\\x1b[1Ab"
    assert visible("\x9b2K\x7f") == "\\x9b2K\\x7f"
    assert visible("line1\nline2") == "line1\\x0aline2"
    assert visible("line1\nline2\tx", keep_newlines=True) == "line1\nline2\tx"
    assert visible("rtl\u202eevil") == "rtl\\u202eevil"
    assert not has_controls(visible("\x00\x1b\x9b"))


def test_safe_text_is_not_markup():
    t = safe_text("[/x] [bold]k[/bold]")
    assert t.plain == "[/x] [bold]k[/bold]"


def test_finding_with_hostile_strings_renders_escaped():
    f = Finding("ckpt-unsafe-pickle", "checkpoint", "warning", "key \x1b[1A\x1b[2K[/x]",
                evidence={"key\x1b[2K": "v\x1b]0;title\x07", "[/x]": "[red]"}, fix="do [/b] \x1b[2J")
    text = render_to_text(Report("checkpoint-audit", target="f\x1b[2K.pt", findings=[f]))
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[1A" in text and "[/x]" in text and "[red]" in text


def test_env_and_dist_sections_escape_environment_values():
    env = {"env_vars": {"NCCL_DEBUG": "\x1b[2J[/x]", "TORCH_X\x1b": "[bold]"},
           "packages": {"related": {"torch": "2\x1b[1A"}}, "warnings": [{"category": "W", "message": "\x1b[2K"}]}
    dist = {"backends": {"gloo": True}, "nccl_version": "\x1b[1A", "launch": {"RANK": "[/x]"},
            "variables": {"NCCL_IB_HCA": "\x1b]0;t\x07[/y]"}, "topology": {"reason": "[/z]\x1b[2K"}}
    text = render_to_text(Report("env", metrics={"env": env, "dist": dist}))
    assert "\x1b" not in text and "\x07" not in text
    assert "[/x]" in text and "\\x1b[2J" in text and "[/z]" in text


def test_report_json_escapes_c1_and_bidi_and_survives_huge_ints():
    import json

    from torchdoctor.report.jsonout import render_json

    f = Finding("script-crashed", "debugging", "error", "t\x9b2K\u202e", evidence={"n": 10 ** 5000})
    text = render_json(Report("checkup", target="x\x7f.py", findings=[f]))
    assert "\x9b" not in text and "\u202e" not in text and "\x7f" not in text
    data = json.loads(text)
    assert data["findings"][0]["title"] == "t\x9b2K\u202e" and data["target"] == "x\x7f.py"
    assert "digits" in data["findings"][0]["evidence"]["n"]
