"""Walk files, parse them, run the rules, apply `# noqa` and --select/--ignore.

A file that does not parse gives one finding with code TD000 (syntax-error), which neither
--select/--ignore nor noqa hides. Columns are 1-based, as in editors.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torchdoctor.lint.context import FileContext, Hit

SYNTAX_ERROR = "TD000"
SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "venv", "build", "dist"}
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+\d+(?:[\s,]+[A-Z]+\d+)*))?", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int
    code: str
    message: str
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Rule:
    """A check with a stable code. `what`, `why`, `example` (code it flags) and `fix` (the
    same code done right) are its documentation."""

    code: str
    name: str
    message: str
    what: str
    why: str
    example: str
    fix: str
    check: Callable[[FileContext], Iterable[Hit]] = field(compare=False, repr=False)
    family: str = ""


@dataclass
class Result:
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


def _parse(source: str, path: str) -> ast.Module | Finding:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for odd escapes is not ours
            return ast.parse(source, filename=path)
    except SyntaxError as exc:
        return Finding(
            path,
            exc.lineno or 1,
            exc.offset or 1,
            SYNTAX_ERROR,
            f"cannot parse: {exc.msg}",
            "syntax-error",
        )
    except ValueError as exc:  # null bytes
        return Finding(path, 1, 1, SYNTAX_ERROR, f"cannot parse: {exc}", "syntax-error")


def lint_source(
    source: str,
    path: str = "<string>",
    rules: Sequence[Rule] | None = None,
    errors: list[str] | None = None,
) -> list[Finding]:
    """The findings for one file's source, noqa applied, sorted by position. A rule that
    fails on the file is skipped and named in `errors` (or raises when `errors` is None)."""
    from torchdoctor.lint.rules import all_rules

    tree = _parse(source, path)
    if isinstance(tree, Finding):
        return [tree]
    ctx = FileContext(path, source, tree)
    noqa = noqa_lines(source)
    found: set[Finding] = set()
    for rule in all_rules() if rules is None else rules:
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


def lint_paths(
    paths: Iterable[str],
    select: str | Sequence[str] | None = None,
    ignore: str | Sequence[str] | None = None,
) -> Result:
    from torchdoctor.lint.rules import all_rules

    rules = select_rules(all_rules(), select, ignore)
    result = Result()
    for path in python_files(paths):
        result.files += 1
        try:
            source = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            result.findings.append(
                Finding(str(path), 1, 1, SYNTAX_ERROR, "cannot read: not UTF-8", "syntax-error")
            )
            continue
        except OSError as exc:
            result.findings.append(
                Finding(
                    str(path), 1, 1, SYNTAX_ERROR, f"cannot read: {exc.strerror}", "syntax-error"
                )
            )
            continue
        result.findings += lint_source(source, str(path), rules, result.errors)
    return result
