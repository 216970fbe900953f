"""What a rule is and what it reports: `Rule` (a check with a stable code and its
documentation), `Hit` (a rule's raw result: a node, maybe a sharper message) and `Finding`
(a hit placed in a file, after noqa)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from torchdoctor.lint.context import FileContext


@dataclass(frozen=True)
class Hit:
    """A rule's finding before it becomes a Finding: the node and, optionally, a message
    more specific than the rule's own."""

    node: ast.AST
    message: str | None = None


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
