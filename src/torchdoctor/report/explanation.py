"""An Explanation as text (full, or brief for `torchdoctor run` after a crash) or JSON, and the
error catalog as a listing or as the Markdown of docs/explain.md."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from torchdoctor._json import dumps
from torchdoctor.errors.api import Explanation
from torchdoctor.errors.catalog import entries, pick, placeholders

WIDTH = 100
MAX_CAUSES = 6
MAX_FIXES = 5
BRIEF_CODE_LINES = 12  # the longest fix of the catalog has 7


def _wrap(text: str, indent: str = "  ", first: str | None = None) -> str:
    return textwrap.fill(
        text,
        width=WIDTH,
        initial_indent=indent if first is None else first,
        subsequent_indent=indent if first is None else " " * len(first),
        break_on_hyphens=False,
        break_long_words=False,
    )


def _field_value(fields: dict[str, Any], name: str) -> str:
    value = fields[name]
    raw = fields.get(f"{name}_bytes")
    if isinstance(raw, int) and isinstance(value, str):
        return f"{value} ({raw:,} bytes)"
    return str(value)


def field_lines(fields: dict[str, Any]) -> list[str]:
    names = [n for n in fields if not (n.endswith("_bytes") and n[: -len("_bytes")] in fields)]
    if not names:
        return []
    width = max(len(n) for n in names)
    return [f"  {n.replace('_', ' ').ljust(width)}  {_field_value(fields, n)}" for n in names]


def render_text(explanation: Explanation, brief: bool = False) -> str:
    """The explanation for a terminal. `brief` gives the few lines `torchdoctor run` prints
    after the script crashed."""
    e = explanation
    if brief:
        return _brief(e)
    out: list[str] = []
    head = f"{e.category}: {e.title}" if e.recognised else e.title
    if e.recognised and getattr(e, "confidence", "high") == "low":
        head += "  (probably: the text does not say so plainly)"
    out.append(head)
    out.append(_wrap(e.summary))
    origin = _origin(e)
    if origin:
        out.append(f"  ({origin})")
    if e.recognised:
        out += ["", "What it means", _wrap(e.meaning)]
    lines = field_lines(e.fields)
    if lines:
        out += ["", "From the message", *lines]
    stated = _fact_lines(getattr(e, "facts", None) or {})
    if stated:
        out += ["", "Facts in the text", *stated]
    evidence = getattr(e, "evidence", None) or []
    if evidence:
        out += ["", "On this machine"]
        out += [_wrap(item, "    ", "  - ") for item in evidence]
    if e.causes:
        out += ["", "Likely causes, most likely first"]
        for i, cause in enumerate(e.causes[:MAX_CAUSES], 1):
            out.append(_wrap(cause, "     ", f"  {i}. "))
        if len(e.causes) > MAX_CAUSES:
            out.append(f"     (+{len(e.causes) - MAX_CAUSES} less likely; --format json lists all)")
    if e.first_steps:
        out += ["", "First steps"]
        out += [_wrap(step, "    ", "  - ") for step in e.first_steps]
    if e.fixes:
        out += ["", "Fixes"]
        for i, fix in enumerate(e.fixes[:MAX_FIXES], 1):
            out.append(_wrap(fix["title"], "     ", f"  {i}. "))
            if fix.get("check"):
                out.append(_wrap(f"(check first: {fix['check']})", "       "))
            out += [f"       {line}".rstrip() for line in fix["code"].splitlines()]
    if e.also:
        out += ["", "Also in this text"]
        for other in e.also:
            where = []
            if other.get("rank") is not None:
                where.append(f"rank {other['rank']}")
            if other.get("line_number") is not None:
                where.append(f"line {other['line_number']}")
            said = f" ({', '.join(where)})" if where else ""
            out.append(_wrap(f"{other['category']}{said}: {other['line']}", "      ", "  - "))
    if e.matched:
        out += ["", _wrap(e.matched, "    ", "Matched: ")]
    if not e.recognised:
        out += ["", "If this error deserves an entry, the catalog lives in torchdoctor/errors/."]
    return "\n".join(out)


def _fact_lines(facts: dict[str, Any]) -> list[str]:
    """What the text states about where it ran (devices, dtypes, versions), one per line."""
    out = []
    for name, value in facts.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        out.append(f"  {name.replace('_', ' ')}: {value}")
    return out


def _origin(e: Explanation) -> str | None:
    """Where the error was read: "from rank 1, line 23" (the rank when the text names it)."""
    rank, line = getattr(e, "rank", None), getattr(e, "line", None)
    if rank is not None and line is not None:
        return f"from rank {rank}, line {line}"
    if line is not None and line > 1:
        return f"from line {line}"
    return None


def _brief(e: Explanation) -> str:
    if not e.recognised:
        return (
            "torchdoctor: this error is not in the catalog; `torchdoctor explain` has generic steps"
        )
    out = [f"torchdoctor: {e.category}: {e.title}", _wrap(e.summary)]
    if e.causes:
        out.append(_wrap(e.causes[0], "    ", "  likely: "))
    if e.fixes:
        fix = e.fixes[0]
        out.append(_wrap(fix["title"], "    ", "  fix: "))
        if fix.get("check"):
            out.append(_wrap(f"(check first: {fix['check']})", "    "))
        out += code_lines(fix["code"], "    ")
    out.append("  (the whole story: save the output and run `torchdoctor explain FILE`)")
    return "\n".join(out)


def code_lines(code: str, indent: str, limit: int = BRIEF_CODE_LINES) -> list[str]:
    """A fix's code for a brief output: whole, unless it is longer than `limit` lines (then
    the lines that fit and how many more there are: a block never ends at its header)."""
    lines = code.splitlines()
    out = [f"{indent}{line}".rstrip() for line in lines[:limit]]
    if len(lines) > limit:
        out.append(f"{indent}# ... {len(lines) - limit} more lines: `torchdoctor explain`")
    return out


def render_json(explanation: Explanation) -> str:
    return dumps(explanation.to_dict(), indent=2)


class PrintableExplanation(Explanation):
    """An Explanation that print() shows as `torchdoctor explain` does (what the public
    `torchdoctor.explain()` returns)."""

    def __str__(self) -> str:
        return render_text(self)


def printable(explanation: Explanation) -> PrintableExplanation:
    return PrintableExplanation(
        **{f.name: getattr(explanation, f.name) for f in fields(explanation)}
    )


def render(explanation: Explanation, fmt: str = "text") -> str:
    """Renderers chosen by name."""
    if fmt == "json":
        return render_json(explanation)
    return render_text(explanation)


# --- the catalog itself ---------------------------------------------------------------------


def _entries() -> Sequence[Any]:
    return entries()


def catalog_text() -> str:
    """One line per category: code and title, grouped by family."""
    out: list[str] = []
    family = None
    for e in _entries():
        if e.family != family:
            family = e.family
            if out:
                out.append("")
            out.append(f"{family}:")
        out.append(f"  {e.code:<28} {e.title}")
    return "\n".join(out)


def catalog_json() -> str:
    records = []
    for e in _entries():
        records.append(
            {
                "code": e.code,
                "family": e.family,
                "title": e.title,
                "meaning": e.meaning,
                "examples": list(e.examples),
                "fields": sorted(
                    {name for t in e.summary for name in placeholders(t)}
                    | {name for c in e.causes for name in placeholders(c.text)}
                ),
                "causes": [c.key for c in e.causes],
                "fixes": [f.title if isinstance(f.title, str) else f.title[-1] for f in e.fixes],
            }
        )
    return json.dumps(records, indent=2)


def _md_code(text: str) -> str:
    fence = "```"
    return f"{fence}\n{text}\n{fence}"


def catalog_markdown() -> str:
    """The generated part of docs/explain.md: every category with its code, meaning, typical
    messages, causes and fixes."""
    out: list[str] = ["| code | title |", "|---|---|"]
    out += [f"| [`{e.code}`](#{e.code.replace('.', '')}) | {e.title} |" for e in _entries()]
    for e in _entries():
        out += ["", f"### {e.code}", "", f"**{e.title}.** {e.meaning}", "", "Typical messages:", ""]
        out += [_md_code(example) for example in e.examples]
        names = sorted(
            {n for t in e.summary for n in placeholders(t)}
            | {n for c in e.causes for n in placeholders(c.text) | placeholders(c.evidence)}
            | {n for f in e.fixes for n in placeholders(f.code) | placeholders(f.title)}
        )
        if names:
            out += ["", "Fields read from the message: " + ", ".join(f"`{n}`" for n in names)]
        out += ["", "Likely causes (ranked for each message by what it says):", ""]
        for cause in e.causes:
            said = pick(cause.text, {}) or _generic(cause.text)
            out.append(f"- {said}")
        out += ["", "First steps:", ""]
        out += [f"- {pick(step, {}) or _generic(step)}" for step in e.first_steps]
        out += ["", "Fixes:", ""]
        for fix in e.fixes:
            title = fix.title if isinstance(fix.title, str) else fix.title[-1]
            code = fix.code if isinstance(fix.code, str) else fix.code[-1]
            out += [f"- {title}", "", textwrap.indent(_md_code(code), "  "), ""]
        while out and out[-1] == "":
            out.pop()
    return "\n".join(out)


def _generic(text: str | tuple[str, ...]) -> str:
    templates = (text,) if isinstance(text, str) else text
    return templates[-1]
