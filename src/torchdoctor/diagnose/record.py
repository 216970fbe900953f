"""A diagnosis as data: what is wrong, where, since when, the numbers, and what to do."""

from __future__ import annotations

import dataclasses
import io
import time
import tokenize
from typing import Any

from torchdoctor._json import dumps

SEVERITIES = ("info", "warning", "error")


@dataclasses.dataclass
class Diagnosis:
    kind: str  # stable code: nan, divergence, hang, ...
    severity: str  # info, warning or error
    summary: str  # one sentence a person reads first
    location: str | None = None  # module qualified name or file:line
    step: int | None = None
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    fix: list[str] = dataclasses.field(default_factory=list)  # ranked remedies
    rank: int = 0
    time: float = dataclasses.field(default_factory=time.time)
    key: str | None = None  # what makes two findings the same one (default: kind + location)
    job: bool = False  # compares ranks: `rank` is the rank it is about, not the one reporting
    resolved: int | None = None  # the step from which it no longer held (None: it holds)
    follows: str | None = None  # the kind of the earlier finding it follows from (story.py)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")
        # A fix is one line of the `fix` column (one remedy per line): a newline would cut it
        # in two wherever it is read back.
        self.fix = [" ".join(f.split()) if "\n" in f else f for f in self.fix]

    @property
    def identity(self) -> str:
        return self.key or f"{self.kind}:{self.location or ''}"

    def row(self) -> tuple[Any, ...]:
        """The python.diagnoses row. A job-level finding carries its identity in its evidence
        (`job_key`), so that the same finding reported by many ranks, or again later, is shown
        once."""
        evidence = dict(self.evidence, job_key=self.identity) if self.job else self.evidence
        return (
            self.time,
            self.step,
            self.rank,
            self.kind,
            self.severity,
            self.location,
            self.summary,
            dumps(evidence),
            "\n".join(self.fix),
            self.resolved,
            self.follows,
        )


CODE_ELSEWHERE = " (its code: `torchdoctor diagnoses RUN_DIR`)"


def fix_with_code(title: str, code: str) -> str:
    """A remedy and its code as one line: the code itself when it fits on one line of Python
    (`with torch.no_grad(): n = f(x)`), else the title and where the code is shown whole."""
    inline = one_line(code)
    if inline is None:
        return title + CODE_ELSEWHERE
    return f"{title}: {inline}" if inline else title


def one_line(code: str) -> str | None:
    """`code` (a few lines of Python) written on one line, comments dropped: statements
    joined with '; ', or one block header followed by its simple statements; None when it
    cannot be one line (nested blocks, a block followed by more code)."""
    lines = _logical_lines(code)
    if len(lines) <= 1:
        return lines[0].strip() if lines else ""
    indents = [len(line) - len(line.lstrip()) for line in lines]
    stripped = [line.strip() for line in lines]
    opens = [line.endswith(":") for line in stripped]
    if not any(opens) and all(i == indents[0] for i in indents):
        return "; ".join(stripped)
    body = indents[1:]
    if opens[0] and not any(opens[1:]) and all(i == body[0] > indents[0] for i in body):
        return f"{stripped[0]} {'; '.join(stripped[1:])}"
    return None


def _logical_lines(code: str) -> list[str]:
    """The non-blank lines of `code` without comments, a statement continued inside brackets
    joined into one line."""
    out: list[str] = []
    depth = 0
    for raw in code.splitlines():
        line = _without_comment(raw)
        if not line.strip():
            continue
        if depth > 0 and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
        opened = sum(line.count(c) for c in "([{") - sum(line.count(c) for c in ")]}")
        depth = max(0, depth + opened)
    return out


def _without_comment(line: str) -> str:
    if "#" not in line:
        return line.rstrip()
    try:
        for token in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if token.type == tokenize.COMMENT:
                indent = len(line) - len(line.lstrip())
                return line[: indent + token.start[1]].rstrip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return line.rstrip()
