"""Another node's summary as node 0 reads it: input from a stranger, like a checkpoint.

Whatever reaches node 0's gather port is untrusted (any process that can reach the port may
write there; a node may run another torchdoctor). :func:`parse` reads it under bounds (size,
JSON items, nesting depth) and :func:`check` keeps only what fits the schema that
:func:`torchdoctor.distributed.jobreport.node_summary` writes (version 1):

- every string: lone surrogates written as ``\\udXXX`` text (nothing downstream can fail to
  encode it), capped; control bytes are escaped where it is rendered (``safe.py``);
- finding codes: only the catalogue's, with the catalogue's severity, skill and docs; evidence
  bounded like every renderer bounds it (``report/caps.py``);
- rank keys: ASCII digits of a rank the node holds; events: the shipped kinds of those ranks,
  with finite numbers where the rules compute (``REQUIRED``, ``NOT_NONE``, ``NUMERIC``), plain
  values where they compare or hash (``SCALARS``), a rank's exception as text;
- anything else is left out, and each kind of thing left out is one *reason*. A summary with
  reasons becomes the ``node-summary-invalid`` finding about that node, never a crash and never
  a finding of its own: an unknown code is evidence of a bad summary, not a finding.

Bounds: ``MAX_BYTES`` per node (the gather port refuses more before reading it), ``MAX_ITEMS``
JSON values, ``MAX_DEPTH`` nesting, ``MAX_EVENTS`` events, ``MAX_FINDINGS`` findings per rank.
"""

from __future__ import annotations

import json
import re
from typing import Any

from torchdoctor.report.caps import bounded, cut_text
from torchdoctor.safe import visible

VERSION = 1
MAX_BYTES = 8 * 1024 * 1024  # one node's summary
MAX_ITEMS = 2_000_000  # JSON values (commas, brackets, braces) in one summary
MAX_DEPTH = 24  # nesting of the whole summary (a finding's evidence is cut deeper: report/caps.py)
MAX_EVENTS = 200_000  # events of one node
MAX_FINDINGS = 200  # findings (and skipped checks) per rank
MAX_RANKS = 100_000  # ranks of one node; a rank number is below 1,000,000
MAX_REASONS = 12  # reasons kept per node (their count is kept too)
TEXT = 4000  # characters kept of a title, a fix
SHORT = 300  # characters kept of a fact, a variable, an error line

SHIPPED = ("step", "dist_step", "step_device", "dist_init", "dist_loader", "dist_batch",
           "collective", "fr_entries", "rank_result", "rank_stacks", "device", "env")
NUMERIC = ("step", "wall_s", "backward_s", "data_s", "forward_s", "optimizer_s", "other_s", "bwd_at",
           "end_at", "coll_s", "span_ms", "backward_ms", "t", "seq", "steps", "exit_code")
# per kind, the fields the cross-rank rules index or hash (beyond NUMERIC: a finite number or None)
REQUIRED = {"step": ("step", "wall_s"), "dist_step": ("step",), "step_device": ("step",)}  # numbers
NOT_NONE = {"step": ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s")}  # numbers if present
SCALARS = {"dist_loader": ("loader", "site", "sampler_kind", "iter", "step", "epoch"),
           "dist_batch": ("loader", "fingerprint"), "collective": ("op", "site", "fn", "dtype", "g")}
RESULT = {"outcome": str, "exit_code": int, "failed_rank": int, "wall_s": float,
          "launcher_returncode": int, "timeout_s": float}
FACTS = ("hostname", "torch", "cuda", "nccl", "driver", "gpu")
RENDEZVOUS = ("ok", "failed", "unknown")


class _TooDeep(Exception):
    pass


def text(s: str, limit: int | None = None) -> str:
    """``s`` with lone surrogates as ``\\udXXX`` text (encodable anywhere), cut at ``limit``."""
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s if limit is None else cut_text(s, limit)


def shown(s: Any, limit: int = 80) -> str:
    """A value from the summary as a reason may quote it: escaped, short, quoted."""
    return f"'{visible(text(str(s)[: limit * 2], limit))}'"


def number(v: Any) -> bool:
    """A finite number of sane size (not a bool): what the rules may compute with."""
    t = type(v)
    if t is float:
        return -1e15 < v < 1e15  # False for NaN and the infinities too
    return t is int and -10**15 < v < 10**15


def decode(blob: bytes) -> tuple[Any, str | None]:
    """Bytes from the gather port → (the decoded JSON, or None and why not): bounded in bytes and
    in values before anything is parsed (every reader of a peer's summary starts here)."""
    if len(blob) > MAX_BYTES:
        return None, f"its summary of {len(blob)} bytes exceeds the {MAX_BYTES}-byte bound"
    items = blob.count(b",") + blob.count(b"[") + blob.count(b"{")
    if items > MAX_ITEMS:
        return None, f"its summary holds about {items} JSON values, over the bound of {MAX_ITEMS}"
    try:
        return json.loads(blob.decode("utf-8")), None
    except RecursionError:
        return None, f"its summary nests deeper than {MAX_DEPTH} levels"
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, too many digits, not UTF-8
        return None, f"its summary is not JSON ({type(e).__name__}: {shown(e, 120)})"


def parse(blob: bytes, node_rank: int) -> tuple[dict[str, Any] | None, list[str]]:
    """Bytes from the gather port → (the checked summary or None, reasons)."""
    data, why = decode(blob)
    if why:
        return None, [why]
    # strict UTF-8 cannot hold a surrogate: only a \uD800-\uDFFF escape makes one (then copy)
    return check(data, node_rank, copy=_SURROGATE_ESCAPE.search(blob) is not None)


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def check(data: Any, node_rank: int, copy: bool = True) -> tuple[dict[str, Any] | None, list[str]]:
    """A decoded summary → (what fits the schema, or None when nothing can be used; reasons).

    ``copy``: make every string encodable and every key a string (anything but JSON decoded
    from text without surrogate escapes needs it); else only the depth is checked."""
    if not isinstance(data, dict):
        return None, [f"its summary is a JSON {type(data).__name__}, not an object"]
    try:
        data = _plain(data, 0) if copy else _shallow_enough(data)
    except _TooDeep:
        return None, [f"its summary nests deeper than {MAX_DEPTH} levels"]
    if data.get("v") != VERSION:
        return None, [f"its summary is of version {shown(data.get('v'))}, not {VERSION}: not this "
                      f"torchdoctor's (run the same torchdoctor on every node)"]
    return _Checker(node_rank).summary(data)


def _plain(x: Any, depth: int) -> Any:
    """A copy of decoded JSON with every string encodable and every key a string; bounded depth."""
    if depth > MAX_DEPTH:
        raise _TooDeep
    if isinstance(x, str):
        return text(x)
    if isinstance(x, dict):
        return {text(str(k)): _plain(v, depth + 1) for k, v in x.items()}
    if isinstance(x, list):
        return [_plain(v, depth + 1) for v in x]
    return x


def _shallow_enough(x: Any) -> Any:
    """``x`` itself, when no list or dict in it is nested deeper than MAX_DEPTH (no recursion)."""
    stack = [(x, 0)]
    while stack:
        v, d = stack.pop()
        if d > MAX_DEPTH:
            raise _TooDeep
        kids = v.values() if isinstance(v, dict) else v
        stack.extend((c, d + 1) for c in kids if isinstance(c, (dict, list)))
    return x


class _Checker:
    """One summary's schema check; ``reasons`` counts what was left out, by kind."""

    def __init__(self, node_rank: int) -> None:
        from torchdoctor.catalog import catalog

        self.k = node_rank
        self.codes = catalog()
        self.reasons: dict[str, int] = {}

    def bad(self, reason: str, n: int = 1) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + n

    def said(self) -> list[str]:
        out = [r if n == 1 else f"{r} (×{n})" for r, n in self.reasons.items()]
        return out[:MAX_REASONS] + ([f"and {len(out) - MAX_REASONS} more reasons"] if len(out) > MAX_REASONS else [])

    def summary(self, s: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        if s.get("node_rank") != self.k:
            self.bad(f"its summary says node_rank {shown(s.get('node_rank'))}, but it was sent as node {self.k}")
        ranks = self.ranks(s.get("ranks"))
        out: dict[str, Any] = {
            "v": VERSION, "node_rank": self.k, "ranks": ranks,
            "nproc": self.opt_int(s, "nproc"), "world_size": self.opt_int(s, "world_size"),
            "facts": self.facts(s.get("facts")), "result": self.result(s.get("result")),
            "rendezvous": self.enum(s, "rendezvous", RENDEZVOUS, "unknown"),
            "rendezvous_error": self.opt_text(s, "rendezvous_error", SHORT),
            "output_tail": self.tail(s.get("output_tail")),
            "rank_reports": self.rank_reports(s.get("rank_reports"), set(ranks)),
            "events": self.events(s.get("events"), set(ranks)),
            "clock": self.clock(s.get("clock")),
            "events_cap": self.opt_int(s, "events_cap"),  # set when the sender shipped fewer to fit
        }
        return out, self.said()

    # ---------------------------------------------------------------- fields
    def opt_int(self, s: dict[str, Any], key: str) -> int | None:
        v = s.get(key)
        if v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10**9):
            return v
        self.bad(f"{key} is {shown(v)}, not a count")
        return None

    def opt_text(self, s: dict[str, Any], key: str, limit: int) -> str | None:
        v = s.get(key)
        if v is None or isinstance(v, str):
            return None if v is None else text(v, limit)
        self.bad(f"{key} is not text")
        return None

    def enum(self, s: dict[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
        v = s.get(key, default)
        if v in allowed:
            return v
        self.bad(f"{key} is {shown(v)}, not one of {', '.join(allowed)}")
        return default

    def ranks(self, v: Any) -> list[int]:
        if v is None:
            return []
        if not isinstance(v, list):
            self.bad("ranks is not a list")
            return []
        good = sorted({r for r in v[:MAX_RANKS] if isinstance(r, int) and not isinstance(r, bool)
                       and 0 <= r < 1_000_000})
        if len(good) != len(v):
            self.bad(f"{len(v) - len(good)} entries of ranks are not distinct rank numbers")
        return good

    def facts(self, v: Any) -> dict[str, Any]:
        if v is None:
            return {"env": {}}
        if not isinstance(v, dict):
            self.bad("facts is not an object")
            return {"env": {}}
        out: dict[str, Any] = {}
        for key in FACTS:
            x = v.get(key)
            if isinstance(x, str) or number(x):
                out[key] = text(str(x), SHORT)
            elif x is not None:
                self.bad(f"facts.{key} is not text")
        env = v.get("env")
        out["env"] = {}
        if isinstance(env, dict):
            items = list(env.items())
            if len(items) > 500:
                self.bad(f"facts.env holds {len(items)} variables, over the bound of 500")
            for name, val in items[:500]:
                if isinstance(val, str):
                    out["env"][text(name, SHORT)] = text(val, SHORT)
                else:
                    self.bad("a variable of facts.env is not text")
        elif env is not None:
            self.bad("facts.env is not an object")
        return out

    def result(self, v: Any) -> dict[str, Any]:
        if v is None:
            return {}
        if not isinstance(v, dict):
            self.bad("result is not an object")
            return {}
        out: dict[str, Any] = {}
        for key, kind in RESULT.items():
            x = v.get(key)
            if x is None:
                continue
            if kind is str and isinstance(x, str):
                out[key] = text(x, 40)
            elif kind is not str and number(x) and (kind is float or isinstance(x, int)):
                out[key] = x
            else:
                self.bad(f"result.{key} is {shown(x)}")
        return out

    def tail(self, v: Any) -> list[str]:
        if v is None:
            return []
        if not isinstance(v, list):
            self.bad("output_tail is not a list")
            return []
        lines = [text(x, 2000) for x in v[-40:] if isinstance(x, str)]
        if len(lines) != len(v[-40:]):
            self.bad("lines of output_tail are not text")
        return lines

    def clock(self, v: Any) -> float | None:
        if v is None or number(v):
            return v
        self.bad(f"clock is {shown(v)}, not a finite number")
        return None

    def rank_reports(self, v: Any, ranks: set[int]) -> dict[str, Any]:
        if v is None:
            return {}
        if not isinstance(v, dict):
            self.bad("rank_reports is not an object")
            return {}
        out: dict[str, Any] = {}
        for key, rep in v.items():
            if not (key.isascii() and key.isdigit() and len(key) < 7 and int(key) in ranks):
                self.bad(f"rank_reports has the key {shown(key)}, not a rank of this node")
                continue
            if not isinstance(rep, dict):
                self.bad(f"rank_reports[{key}] is not an object")
                continue
            fs, sk = rep.get("findings", []), rep.get("skipped", [])
            if not isinstance(fs, list) or not isinstance(sk, list):
                self.bad(f"rank_reports[{key}] has findings or skipped that are not lists")
                fs, sk = (fs if isinstance(fs, list) else []), (sk if isinstance(sk, list) else [])
            if len(fs) > MAX_FINDINGS:
                self.bad(f"rank {key} has {len(fs)} findings, over the bound of {MAX_FINDINGS}")
            found = [f for f in map(self.finding, fs[:MAX_FINDINGS]) if f]
            skipped = [{"rule": text(x["rule"], 100), "reason": text(x["reason"], 500)}
                       for x in sk[:MAX_FINDINGS] if isinstance(x, dict)
                       and isinstance(x.get("rule"), str) and isinstance(x.get("reason"), str)]
            if len(skipped) != len(sk[:MAX_FINDINGS]):
                self.bad("entries of skipped are not {rule, reason} text")
            out[str(int(key))] = {"findings": found, "skipped": skipped}
        return out

    def finding(self, d: Any) -> dict[str, Any] | None:
        if not isinstance(d, dict) or not isinstance(d.get("code"), str):
            self.bad("a finding without a code")
            return None
        info = self.codes.get(d["code"])
        if info is None:
            self.bad(f"the finding code {shown(d['code'])} is not in this torchdoctor's catalogue")
            return None
        title, fix, ev = d.get("title", ""), d.get("fix", ""), d.get("evidence", {})
        if not (isinstance(title, str) and isinstance(fix, str) and isinstance(ev, dict)):
            self.bad(f"a {info.code} finding whose title, fix or evidence has the wrong type")
            return None
        return {"code": info.code, "severity": info.severity, "skill": info.skill, "docs": info.docs,
                "title": text(title, TEXT), "fix": text(fix, TEXT), "evidence": bounded(ev)}

    def events(self, v: Any, ranks: set[int]) -> list[dict[str, Any]]:
        if v is None:
            return []
        if not isinstance(v, list):
            self.bad("events is not a list")
            return []
        if len(v) > MAX_EVENTS:
            self.bad(f"{len(v)} events, over the bound of {MAX_EVENTS} (the rest left out)")
        out = []
        numeric = set(NUMERIC)
        for e in v[:MAX_EVENTS]:
            if not (isinstance(e, dict) and e.get("kind") in SHIPPED):
                self.bad("events of a kind torchdoctor does not ship")
            elif not (isinstance(e.get("rank"), int) and not isinstance(e["rank"], bool) and e["rank"] in ranks):
                self.bad("events of a rank this node does not hold")
            elif not _numbers_fit(e, numeric):
                self.bad("events with a field that is not a finite number")
            elif not all(isinstance(e.get(f), (str, int, float, bool, type(None))) for f in SCALARS.get(e["kind"], ())):
                self.bad("events with a field that is a list or an object where a value belongs")
            elif e["kind"] == "rank_result" and e.get("exception") is not None and not _exception_ok(e["exception"]):
                self.bad("a rank's exception that is not {type, message, chain} text (left out)")
                out.append({k: v for k, v in e.items() if k != "exception"})
            else:
                out.append(e)
        return out


def _numbers_fit(e: dict[str, Any], numeric: set[str]) -> bool:
    """NUMERIC fields a finite number or None; REQUIRED ones a number; NOT_NONE ones, if there, too."""
    for f in numeric.intersection(e):
        if e[f] is not None and not number(e[f]):
            return False
    kind = e["kind"]
    for f in REQUIRED.get(kind, ()):
        if not number(e.get(f)):
            return False
    for f in NOT_NONE.get(kind, ()):
        if f in e and e[f] is None:
            return False
    return True


def _exception_ok(x: Any) -> bool:
    """A rank's exception as the harness writes it: text fields, a chain of the same."""
    def texts(d: Any) -> bool:
        return isinstance(d, dict) and all(d.get(k) is None or isinstance(d[k], str) for k in ("type", "message"))

    chain = x.get("chain") if isinstance(x, dict) else None
    return texts(x) and (chain is None or (isinstance(chain, list) and all(map(texts, chain))))
