"""JUnit XML of a report: one test case per finding code judged, for CI test-result viewers.

The codes judged are those the rules of the report's probes may raise (``judge.rules_for``; a
script probe also runs the ``run`` rules, a ranked run the ``ranks`` rules, a multi-node job the
``nodes`` rules). A code with a warning or error finding is a ``<failure>`` (its title as message,
evidence and fix as text); an info finding passes with its title in ``<system-out>``; a code all of
whose rules were skipped is ``<skipped>`` with the reason (not applicable is not healthy); a
finding whose code no judged rule declares (a crash, an internal error) is its own failed case.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

from torchdoctor.report.formats import Format

SCRIPT_PROBES = {"checkup", "profile", "memory", "nan", "compile", "treat", "repro", "gradcheck"}
ALIASES = {"demo": "checkup"}
FAILING = ("error", "warning")


def probes_of(report: dict[str, Any]) -> list[str]:
    command = str(report.get("command") or "")
    probe = ALIASES.get(command, command)
    metrics = report.get("metrics") or {}
    if command == "dist":
        out = ["dist-env", "dist-selftest"] + (["run", "dist"] if metrics.get("steps") else [])
    else:
        out = [probe] + (["run"] if probe in SCRIPT_PROBES else [])
    if "ranks" in metrics:
        out.append("ranks")
    if "nodes" in metrics:
        out.append("nodes")
    return out


def judged_codes(report: dict[str, Any]) -> dict[str, list[str]]:
    """code → the names of the rules that may raise it, for the report's probes."""
    from torchdoctor.judge import rules_for

    out: dict[str, list[str]] = {}
    for probe in probes_of(report):
        for r in rules_for(probe):
            for code in sorted(r.raises):
                out.setdefault(code, [])
                if r.name not in out[code]:
                    out[code].append(r.name)
    return out


def _text(f: dict[str, Any]) -> str:
    ev = json.dumps(f.get("evidence") or {}, indent=1, ensure_ascii=False, default=str)[:8000]
    return f"{f.get('title', '')}\n\nevidence: {ev}\n\nfix: {f.get('fix', '')}\ndocs: {f.get('docs', '')}"


def to_junit(report: dict[str, Any]) -> ET.Element:
    from torchdoctor.catalog import catalog

    infos = catalog()
    codes = judged_codes(report)
    findings: dict[str, list[dict]] = {}
    for f in report.get("findings") or []:
        if isinstance(f, dict):
            findings.setdefault(str(f.get("code")), []).append(f)
    skipped = {s.get("rule"): s.get("reason") for s in report.get("skipped") or [] if isinstance(s, dict)}
    suite_name = f"torchdoctor {report.get('command', '')} {report.get('target') or ''}".strip()
    suite = ET.Element("testsuite", name=suite_name)
    counts = {"tests": 0, "failures": 0, "skipped": 0}
    for code in sorted(set(codes) | set(findings)):
        skill = infos[code].skill if code in infos else "torchdoctor"
        case = ET.SubElement(suite, "testcase", classname=f"torchdoctor.{skill}", name=code)
        counts["tests"] += 1
        mine = findings.get(code, [])
        bad = [f for f in mine if f.get("severity") in FAILING]
        if bad:
            counts["failures"] += 1
            worst = "error" if any(f.get("severity") == "error" for f in bad) else "warning"
            fail = ET.SubElement(case, "failure", type=worst, message=str(bad[0].get("title", ""))[:1000])
            fail.text = "\n\n".join(_text(f) for f in bad)
        elif mine:
            ET.SubElement(case, "system-out").text = "\n".join(f"info: {f.get('title', '')}" for f in mine)
        elif codes.get(code) and all(r in skipped for r in codes[code]):
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", message="; ".join(f"{r}: {skipped[r]}" for r in codes[code])[:1000])
    for k, v in counts.items():
        suite.set(k, str(v))
    suite.set("errors", "0")
    root = ET.Element("testsuites", name="torchdoctor", tests=str(counts["tests"]),
                      failures=str(counts["failures"]), errors="0", skipped=str(counts["skipped"]))
    root.append(suite)
    return root


def render(report: dict[str, Any]) -> str:
    from torchdoctor.safe import visible

    root = to_junit(report)
    for el in root.iter():  # XML 1.0 cannot hold most control characters: make them visible
        for k, v in list(el.attrib.items()):
            el.set(k, visible(v))
        if el.text:
            el.text = visible(el.text, keep_newlines=True)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


FORMAT = Format("junit", ".xml", '<testsuites name="torchdoctor"', render)
