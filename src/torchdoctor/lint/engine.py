"""Walk files, parse them, run the rules they are given, apply `# noqa` and --select/--ignore.

A file that does not parse gives one finding with code TD000 (syntax-error), which neither
--select/--ignore nor noqa hides. Columns are 1-based, as in editors. The engine knows no
rule by name: the caller passes them (lint.rules.all_rules() for the catalog).
"""

from __future__ import annotations

import io
import os
import re
import tokenize
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from torchdoctor.lint.context import FileContext
from torchdoctor.lint.parse import LoweringFailed, SyntaxProblem, decode, parse
from torchdoctor.lint.rule import Finding, Rule

SYNTAX_ERROR = "TD000"
SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "venv", "build", "dist"}
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+\d+(?:[\s,]+[A-Z]+\d+)*))?", re.IGNORECASE)


@dataclass
class LintResult:
    findings: list[Finding] = field(default_factory=list)
    files: int = 0
    errors: list[str] = field(default_factory=list)  # rules that failed on a file (our bugs)


class SelectionError(ValueError):
    """--select/--ignore named a code that no rule has."""


def _matches(rule: Rule, token: str) -> bool:
    token = token.strip()
    return rule.code.upper().startswith(token.upper()) or rule.name == token.lower()


def _tokens(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    return [t.strip() for item in items for t in item.split(",") if t.strip()]


def select_rules(
    rules: Sequence[Rule],
    select: str | Sequence[str] | None = None,
    ignore: str | Sequence[str] | None = None,
) -> list[Rule]:
    """The rules chosen by code prefixes (TD1, TD101) or names; unknown ones are an error."""
    chosen, dropped = _tokens(select), _tokens(ignore)
    for token in [*chosen, *dropped]:
        if not any(_matches(r, token) for r in rules):
            raise SelectionError(f"no rule matches {token!r}")
    out = [r for r in rules if not chosen or any(_matches(r, t) for t in chosen)]
    return [r for r in out if not any(_matches(r, t) for t in dropped)]


def noqa_lines(source: str) -> dict[int, set[str] | None]:
    """Line -> the codes its `# noqa: CODE` comment names (None: a bare `# noqa`, all)."""
    out: dict[int, set[str] | None] = {}
    if "noqa" not in source.lower():
        return out
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return out
    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            continue
        m = _NOQA.search(tok.string)
        if m is None:
            continue
        codes = m.group("codes")
        out[tok.start[0]] = (
            None if codes is None else {c.upper() for c in re.split(r"[\s,]+", codes) if c}
        )
    return out


def _suppressed(finding: Finding, noqa: dict[int, set[str] | None]) -> bool:
    if finding.line not in noqa:
        return False
    codes = noqa[finding.line]
    return codes is None or finding.code in codes


def _syntax_finding(path: str, problem: SyntaxProblem) -> Finding:
    return Finding(path, problem.line, problem.col, SYNTAX_ERROR, problem.message, "syntax-error")


def lint_source(
    source: str,
    rules: Sequence[Rule],
    path: str = "<string>",
    errors: list[str] | None = None,
) -> list[Finding]:
    """The findings of `rules` for one file's source, noqa applied, sorted by position. A
    rule that fails on the file is skipped and named in `errors` (or raises when `errors`
    is None)."""
    try:
        tree = parse(source, path)
    except LoweringFailed as exc:
        if errors is None:
            raise
        errors.append(f"{path}: valid syntax that lint cannot read yet ({exc})")
        return []
    if isinstance(tree, SyntaxProblem):
        return [_syntax_finding(path, tree)]
    ctx = FileContext(path, source, tree)
    noqa = noqa_lines(source)
    found: set[Finding] = set()
    for rule in rules:
        try:
            hits = list(rule.check(ctx))
        except Exception as exc:  # a bug of ours must not end the whole run
            if errors is None:
                raise
            errors.append(f"{path}: rule {rule.code} failed ({type(exc).__name__}: {exc})")
            continue
        for hit in hits:
            line = getattr(hit.node, "lineno", 1)
            col = getattr(hit.node, "col_offset", 0) + 1
            finding = Finding(path, line, col, rule.code, hit.message or rule.message, rule.name)
            if not _suppressed(finding, noqa):
                found.add(finding)
    return sorted(found, key=lambda f: (f.line, f.col, f.code))


def python_files(paths: Iterable[str]) -> Iterator[Path]:
    """The Python files under the paths (a file named explicitly is always included).
    Raises FileNotFoundError for a path that does not exist."""
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise FileNotFoundError(raw)
        if path.is_file():
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
            for name in sorted(files):
                if name.endswith(".py"):
                    yield Path(root) / name


def lint_paths(paths: Iterable[str], rules: Sequence[Rule]) -> LintResult:
    """Every Python file under the paths, checked with `rules` (see select_rules)."""
    result = LintResult()
    for path in python_files(paths):
        result.files += 1
        try:
            source = decode(path.read_bytes())
        except OSError as exc:
            source = SyntaxProblem(1, 1, f"cannot read: {exc.strerror}")
        if isinstance(source, SyntaxProblem):
            result.findings.append(_syntax_finding(str(path), source))
            continue
        result.findings += lint_source(source, rules, str(path), result.errors)
    return result
