"""SARIF 2.1.0 of a report, for GitHub code scanning and other CI viewers.

One rule per finding code of the catalogue (its summary, default level, skill tag and doc page
as ``helpUri``); one result per finding with its level (error → ``error``, warning →
``warning``, info → ``note``), its title as message and a ``FILE:LINE`` location: the first
``something.py:N`` in the title or the evidence (the loop, the site, the line a finding names);
a finding that names no line points at line 1 of the report's target, and a report without a
file target (``env``, ``dist`` without SCRIPT) gives a result with no location. Paths under the
current folder are written relative to it (``%SRCROOT%``), as code scanning expects.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from torchdoctor.errors import ISSUES_URL
from torchdoctor.report.formats import Format

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
DOCS_URL = ISSUES_URL.rsplit("/issues", 1)[0] + "/blob/main/"
LEVELS = {"error": "error", "warning": "warning", "info": "note"}
LOCATION_RE = re.compile(r"((?:[A-Za-z]:)?[\w.~/\\-]*[\w-]\.py):(\d+)")


def location_of(finding: dict[str, Any]) -> tuple[str, int] | None:
    """The first ``FILE.py:LINE`` the finding names (title first, then the evidence's values)."""
    texts: list[str] = [str(finding.get("title", ""))]
    for v in (finding.get("evidence") or {}).values():
        if isinstance(v, str):
            texts.append(v)
        elif isinstance(v, list):
            texts += [x for x in v[:20] if isinstance(x, str)]
    for t in texts:
        m = LOCATION_RE.search(t)
        if m and int(m.group(2)) > 0:
            return m.group(1), int(m.group(2))
    return None


def _uri(path: str) -> tuple[str, bool]:
    """(uri, relative to %SRCROOT%)."""
    p = Path(path)
    if p.is_absolute():
        try:
            return p.resolve().relative_to(Path.cwd().resolve()).as_posix(), True
        except (ValueError, OSError):
            return p.as_uri(), False
    return p.as_posix(), True


def _target_file(report: dict[str, Any]) -> str | None:
    target = str(report.get("target") or "").split(" ")[0]
    return target if target.endswith(".py") else None


def _rules() -> tuple[list[dict], dict[str, int]]:
    from torchdoctor.catalog import catalog

    rules, index = [], {}
    for i, info in enumerate(sorted(catalog().values(), key=lambda c: c.code)):
        index[info.code] = i
        rules.append({
            "id": info.code,
            "name": "".join(w.capitalize() for w in re.split(r"[^A-Za-z0-9]+", info.code)),
            "shortDescription": {"text": info.summary},
            "fullDescription": {"text": f"{info.summary} (torchdoctor explain {info.code})"},
            "helpUri": DOCS_URL + info.docs,
            "help": {"text": f"{info.summary}. What it means, how it is measured and how to fix it: "
                             f"{info.docs} (`torchdoctor explain {info.code}`)."},
            "defaultConfiguration": {"level": LEVELS[info.severity]},
            "properties": {"tags": [info.skill]},
        })
    return rules, index


def _result(f: dict[str, Any], index: dict[str, int], target: str | None) -> dict[str, Any]:
    code = str(f.get("code"))
    res: dict[str, Any] = {"ruleId": code, "level": LEVELS.get(str(f.get("severity")), "note"),
                           "message": {"text": str(f.get("title") or code)}}
    if code in index:
        res["ruleIndex"] = index[code]
    where = location_of(f) or ((target, 1) if target else None)
    if where is not None:
        uri, relative = _uri(where[0])
        art: dict[str, Any] = {"uri": uri}
        if relative:
            art["uriBaseId"] = "%SRCROOT%"
        res["locations"] = [{"physicalLocation": {"artifactLocation": art,
                                                  "region": {"startLine": where[1]}}}]
    if f.get("fix"):
        res["properties"] = {"fix": str(f["fix"])}
    return res


def to_sarif(report: dict[str, Any]) -> dict[str, Any]:
    from torchdoctor.version import __version__

    rules, index = _rules()
    target = _target_file(report)
    results = [_result(f, index, target) for f in report.get("findings") or [] if isinstance(f, dict)]
    status = report.get("status")
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "torchdoctor", "version": str(report.get("version") or __version__),
                                "semanticVersion": __version__,
                                "informationUri": DOCS_URL + "README.md", "rules": rules}},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().resolve().as_uri() + "/"}},
            "invocations": [{"executionSuccessful": status not in ("error",),
                             "commandLine": f"torchdoctor {report.get('command', '')} {report.get('target') or ''}".strip(),
                             "properties": {"status": status}}],
            "results": results,
            "properties": {"command": report.get("command"), "reportSchema": report.get("schema")},
        }],
    }


def render(report: dict[str, Any]) -> str:
    import json

    return json.dumps(to_sarif(report), indent=2, ensure_ascii=False)


FORMAT = Format("sarif", ".sarif", '"name": "torchdoctor"', render)
