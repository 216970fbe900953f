"""Lint findings and the rule catalog as text, JSON or the Markdown of docs/lint.md."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchdoctor.lint.rule import Rule


def findings_text(findings: Sequence[Any], files: int) -> str:
    lines = [f"{f.path}:{f.line}:{f.col}: {f.code} {f.message}" for f in findings]
    noun = "file" if files == 1 else "files"
    if findings:
        problems = "problem" if len(findings) == 1 else "problems"
        lines.append(f"Found {len(findings)} {problems} ({files} {noun} checked).")
    else:
        lines.append(f"No problems found ({files} {noun} checked).")
    return "\n".join(lines)


def findings_json(findings: Sequence[Any]) -> str:
    return json.dumps([f.to_dict() for f in findings], indent=2)


def render(findings: Sequence[Any], files: int, fmt: str = "text") -> str:
    """Renderers chosen by name."""
    return findings_json(findings) if fmt == "json" else findings_text(findings, files)


def _rule_dict(rule: Rule) -> dict[str, Any]:
    return {
        "code": rule.code,
        "name": rule.name,
        "family": rule.family,
        "message": rule.message,
        "what": rule.what,
        "why": rule.why,
        "example": rule.example,
        "fix": rule.fix,
    }


def rules_text(rules: Sequence[Any]) -> str:
    width = max((len(r.name) for r in rules), default=0)
    return "\n".join(f"{r.code}  {r.name.ljust(width)}  {r.message}" for r in rules)


def rules_json(rules: Sequence[Any]) -> str:
    return json.dumps([_rule_dict(r) for r in rules], indent=2)


def rule_text(rule: Rule) -> str:
    """Everything about one rule, for `torchdoctor lint --rule CODE`."""

    def para(title: str, body: str) -> list[str]:
        return [title, textwrap.fill(body, 100, initial_indent="  ", subsequent_indent="  ")]

    out = [f"{rule.code} {rule.name} ({rule.family})", ""]
    out += [*para("What it finds", rule.what), ""]
    out += [*para("Why it hurts", rule.why), ""]
    out += ["Example", textwrap.indent(rule.example, "    "), ""]
    out += ["Fix", textwrap.indent(rule.fix, "    ")]
    out += ["", f"Silence one line with `# noqa: {rule.code}`."]
    return "\n".join(out)


def rules_markdown(rules: Sequence[Any]) -> str:
    """The generated part of docs/lint.md."""
    fence = "```"
    out = ["| code | name | finds |", "|---|---|---|"]
    out += [f"| [{r.code}](#{r.code.lower()}) | `{r.name}` | {r.message} |" for r in rules]
    for r in rules:
        out += [
            "",
            f"### {r.code}",
            "",
            f"`{r.name}` ({r.family}). **What it finds:** {r.what}",
            "",
            f"**Why it hurts:** {r.why}",
            "",
            "Example:",
            "",
            f"{fence}python\n{r.example}\n{fence}",
            "",
            "Fix:",
            "",
            f"{fence}python\n{r.fix}\n{fence}",
        ]
    return "\n".join(out)
