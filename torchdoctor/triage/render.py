"""Console rendering of an ``Answer`` with rich: decisive line, routes with why and playbook, next command.

Everything that comes from the input (the query, quoted log lines, file paths and names of frames,
numbers' text values, the why that quotes them, SCRIPT) is untrusted: it goes through
``safe.visible`` (control bytes shown as ``\\x1b``, tabs as spaces) and into ``Text``,
never parsed as markup.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from torchdoctor.safe import visible
from torchdoctor.triage.answer import Answer
from torchdoctor.errortext.numbers import human

_KIND_MARK = {"oom": ("✗", "bold red"), "error": ("✗", "bold red"), "exception": ("✗", "bold red"),
              "nan": ("!", "bold yellow"), "warning": ("!", "bold yellow")}


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """`ask ... | head`: the reader left; stop writing (rich's default would exit 1)."""
        self.quiet = True
        raise BrokenPipeError


def _v(s) -> str:
    """Untrusted text, printable: tabs as spaces, every other control byte escaped."""
    return visible(str(s).replace("\t", "    "))


def _t(s, style: str = "") -> Text:
    return Text(_v(s), style=style)


def make_console(stderr: bool = False) -> Console:
    return _Console(stderr=stderr, highlight=False, soft_wrap=False)


def _fmt_number(k: str, v) -> str:
    if k == "too_large" and isinstance(v, list):
        return "too large to be real: " + ", ".join(str(x).replace("_bytes", "").replace("_", " ") for x in v)
    if k.endswith("_bytes") and isinstance(v, (int, float)):
        return f"{k[:-6].replace('_', ' ')} {human(v)}"
    if isinstance(v, list):
        return f"{k.replace('_', ' ')} " + ", ".join(
            f"pid {x['pid']}: {human(x['bytes'])}" if isinstance(x, dict) and "pid" in x else str(x) for x in v)
    return f"{k.replace('_', ' ')} {v}"


def _sub(cmd: str, ans: Answer) -> str:
    return ans.sub(cmd)


def _query_line(ans: Answer) -> Text:
    t = Text("torchdoctor ", style="bold")
    t.append("ask", style="bold magenta")
    if ans.mode == "log":
        t.append(f"  {ans.source}: {ans.lines} lines", style="dim")
    else:
        q = " ".join(ans.query.split())
        t.append("  ")
        t.append(f"\"{_v(q if len(q) <= 200 else q[:199] + '…')}\"")
    return t


def _decisive(ans: Answer) -> list:
    d = ans.decisive
    if d is None:
        return []
    mark, style = _KIND_MARK.get(d.kind, ("•", "bold"))
    head = Text()
    head.append(f"{mark} ", style=style)
    where = f"line {d.line} of {ans.lines}" if ans.mode == "log" else "recognised error text"
    head.append(f"{d.title or d.kind}", style=style)
    head.append(f"  ({where}" + (f", {d.id})" if d.id else ")"), style="dim")
    g = _grid(2)
    g.add_row(Text("│", style="dim"), _t(d.text))
    if d.via:
        g.add_row(Text("│", style="dim"), _t("wrapped by: " + d.via, style="dim"))
    nums = [(k, v) for k, v in ans.numbers.items() if not k.endswith("_examples")]
    if nums:
        g.add_row("", _t(" · ".join(_fmt_number(k, v) for k, v in nums), style="cyan"))
    for n in ans.notes:
        g.add_row("", _t(f"• {n}", style="cyan"))
    if d.explain:
        g.add_row("", Text("Means: ", style="bold") + _t(d.explain))
    if d.first_step:
        g.add_row("", Text("First step: ", style="bold") + _t(_sub(d.first_step, ans)))
    if d.where:
        g.add_row("", Text("In your code: ", style="bold") + _t(d.where))
    return [head, g]


def _grid(indent: int) -> Table:
    g = Table.grid(padding=(0, 1))
    g.add_column(width=indent, justify="right", no_wrap=True)
    g.add_column(ratio=1)
    return g


def _routes(ans: Answer) -> list:
    out: list = [Text("Routes, in order:" if len(ans.routes) > 1 else "Route:", style="bold")]
    for i, r in enumerate(ans.routes, 1):
        g = _grid(3)
        head = Text(r.skill, style="bold green")
        head.append("  →  ")
        head.append(_v(_sub(r.probe, ans)), style="bold cyan")
        g.add_row(Text(f"{i}.", style="bold"), head)
        g.add_row("", Text("why: ", style="dim") + _t(r.why, style="dim"))
        out.append(g)
        steps = _grid(6)
        for j, s in enumerate(r.steps, 1):
            line = _t(_sub(s["text"], ans))
            line.append(f"  [{_v(_sub(s['by'], ans))}]", style="cyan" if s["by"] != "by hand" else "dim")
            steps.add_row(Text(f"{j}."), line)
        out.append(steps)
    return out


def _also(ans: Answer) -> list[Text]:
    if not ans.also:
        return []
    out = [Text("Also in the input:", style="bold")]
    for a in ans.also:
        label = a.get("id") or a.get("kind")
        count = f" ×{a['count']}" if a.get("count", 1) > 1 else ""
        t = Text(f"  line {a['line']:>6}  ", style="dim")
        t.append(f"{_v(label)}{count}: ", style="yellow")
        t.append(_v(a["text"][:160]))
        out.append(t)
    return out


def render(ans: Answer, console: Console | None = None) -> None:
    con = console or make_console()
    con.print(_query_line(ans))
    if ans.corrections:
        con.print(_t("  read " + ", ".join(f"\"{a}\" as \"{b}\"" for a, b in ans.corrections), style="dim"))
    for lim in ans.limits:
        con.print(_t(f"  limit: {lim}", style="dim"))
    blocks = [_decisive(ans)]
    if ans.clarify:
        q = Text("? ", style="bold yellow") + Text(ans.clarify, style="bold")
        hint = _grid(1)
        hint.add_row("", Text("No recognisable symptom yet, so no route: answer with what you see, e.g. "
                              "torchdoctor ask \"loss becomes NaN after epoch 3\", or paste the error: "
                              "torchdoctor ask - < train.log", style="dim"))
        blocks.append([q, hint])
    else:
        blocks.append(_routes(ans))
    blocks.append(_also(ans))
    for b in blocks:
        if b:
            con.print()
            for line in b:
                con.print(line)
    if ans.next_command:
        con.print()
        con.print(Text("Next: ", style="bold") + _t(_sub(ans.next_command, ans), style="bold cyan"))
