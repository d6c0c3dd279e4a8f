"""What `ask` answers: routes in order with their why, or one clarifying question; JSON per docs/contract.md."""

from __future__ import annotations

from dataclasses import dataclass, field

from torchdoctor.version import __version__


@dataclass
class Matched:
    """One piece of evidence for a route: words of the query or a line of the log."""

    label: str  # the routing table's name for it ("CUDA out of memory", "multiple GPUs")
    skill: str
    kind: str  # "error" | "symptom" | "topic" | "context"
    text: str  # the words or the line as written
    weight: int
    pos: int = 0  # where it starts (character offset in the query, or line number in a log)
    line: int | None = None  # log line number for error matches
    id: str | None = None  # error knowledge-base id

    def to_dict(self) -> dict[str, object]:
        d = {"pattern": self.label, "skill": self.skill, "kind": self.kind, "text": self.text}
        if self.line is not None:
            d["line"] = self.line
        if self.id:
            d["id"] = self.id
        return d


@dataclass
class Route:
    skill: str
    why: str
    probe: str
    steps: list[dict[str, str]]  # [{"text", "by"}]
    matched: list[Matched] = field(default_factory=list)
    order_why: list[str] = field(default_factory=list)
    after: str | None = None  # the command offered once the probe has measured (e.g. treat)

    def to_dict(self) -> dict[str, object]:
        d = {
            "skill": self.skill,
            "why": self.why,
            "probe": self.probe,
            "steps": [f"{s['text']} [{s['by']}]" for s in self.steps],
            "steps_detail": self.steps,
            "matched": [m.to_dict() for m in self.matched],
        }
        if self.after:
            d["after"] = self.after
        return d


@dataclass
class Decisive:
    """The line of a log or pasted error that decides the answer."""

    line: int
    text: str
    kind: str  # "oom" | "error" | "exception" | "nan" | "warning"
    id: str | None = None
    title: str | None = None
    skill: str | None = None
    explain: str | None = None
    first_step: str | None = None
    where: str | None = None
    via: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Answer:
    query: str
    source: str  # "args" | "stdin"
    mode: str  # "query" | "log"
    lines: int
    clarify: str | None = None
    routes: list[Route] = field(default_factory=list)
    recognized: list[Matched] = field(default_factory=list)
    decisive: Decisive | None = None
    numbers: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # plain statements read off the numbers
    also: list[dict[str, object]] = field(default_factory=list)  # other notable lines of a log
    corrections: list[tuple[str, str]] = field(default_factory=list)  # typos read as...
    script: str | None = None  # SCRIPT given with --run, substituted into commands
    limits: list[str] = field(default_factory=list)  # caps that applied to this input (read, words)

    def sub(self, cmd: str) -> str:
        """``cmd`` with SCRIPT / PATH replaced by the script given with --run."""
        if self.script:
            return cmd.replace("[SCRIPT]", self.script).replace("SCRIPT", self.script).replace("PATH", self.script)
        return cmd

    def route_for_run(self) -> dict[str, object]:
        """What ``ask --run`` hands to the probe's report (``metrics.route``): the first route in
        full (why, probe, playbook), the routes after it, and what the input showed."""
        d = self.to_dict()
        first = dict(d["routes"][0])
        first["probe"] = self.sub(first["probe"])
        if first.get("after"):
            first["after"] = self.sub(first["after"])
        return {
            "query": self.query,
            **first,
            "then": [{"skill": r["skill"], "why": r["why"], "probe": self.sub(r["probe"]), "steps": r["steps"]}
                     for r in d["routes"][1:]],
            "decisive_line": d["decisive_line"],
            "numbers": d["numbers"],
            "notes": d["notes"],
            "recognized": d["recognized"],
            "input": d["input"],
        }

    @property
    def next_command(self) -> str | None:
        return self.routes[0].probe if self.routes else None

    def to_dict(self) -> dict[str, object]:
        return {
            "tool": "torchdoctor",
            "version": __version__,
            "schema": 1,
            "command": "ask",
            "query": self.query,
            "clarify": self.clarify,
            "routes": [r.to_dict() for r in self.routes],
            "recognized": [m.to_dict() for m in self.recognized],
            "decisive_line": self.decisive.to_dict() if self.decisive else None,
            "numbers": self.numbers,
            "notes": self.notes,
            "also": self.also,
            "corrections": [{"typed": a, "read_as": b} for a, b in self.corrections],
            "next": self.next_command,
            "input": {"source": self.source, "mode": self.mode, "lines": self.lines, "limits": self.limits},
        }
