"""Where a file switched autograd off for a line that ran: a `with torch.no_grad():` (or
inference_mode(), set_grad_enabled(False), a wrapper named after them) whose block holds it,
a grad-off decorator of the function that holds it, or the last such block above it in that
function. What turns autograd off is the rules' own grammar (rules/_patterns.grad_off_item);
the crash of a backward() on a loss without grad_fn names the switch (telemetry/crash.py).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from torchdoctor.lint.context import FileContext, walk_scope
from torchdoctor.lint.rules._patterns import grad_off_item

# (file, line, function): a place that ran, as a traceback gives it
Place = tuple[str, int, str]


def switch_off(places: list[Place]) -> tuple[str, int, str] | None:
    """(file, line, the switch as written) for `places`, innermost first: a switch around one
    of them before one above any of them; None when their sources show none."""
    for nearest in (_around, _above):
        for path, line, function in places:
            ctx = _context(path)
            found = nearest(ctx, line, function) if ctx is not None else None
            if found is not None:
                return path, found.lineno, _header(found)
    return None


@functools.lru_cache(maxsize=16)
def _context(path: str) -> FileContext | None:
    try:
        source = Path(path).read_text(encoding="utf-8")
        return FileContext(path, source, ast.parse(source, filename=path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None


def _scope(ctx: FileContext, line: int, function: str) -> ast.AST:
    """The function `function` that holds `line` (the module for module-level code)."""
    for node in ast.walk(ctx.tree):
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == function
            and node.lineno <= line <= (node.end_lineno or 0)
        ):
            return node
    return ctx.tree


def _blocks(ctx: FileContext, scope: ast.AST) -> list[ast.With | ast.AsyncWith]:
    """The grad-off `with` blocks of the scope's own code."""
    return [
        node
        for node in walk_scope(scope)
        if isinstance(node, (ast.With, ast.AsyncWith))
        and any(grad_off_item(ctx, item.context_expr) for item in node.items)
    ]


def _around(ctx: FileContext, line: int, function: str) -> ast.stmt | ast.expr | None:
    """A grad-off decorator of the function that holds `line`, else the innermost grad-off
    `with` whose block holds it."""
    scope = _scope(ctx, line, function)
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        switches = [d for d in scope.decorator_list if grad_off_item(ctx, d)]
        if switches:
            return switches[0]
    held = [b for b in _blocks(ctx, scope) if b.body[0].lineno <= line <= (b.end_lineno or 0)]
    return max(held, key=lambda b: b.lineno, default=None)


def _above(ctx: FileContext, line: int, function: str) -> ast.stmt | None:
    """The last grad-off `with` of the function that holds `line` that ends above it."""
    ended = [b for b in _blocks(ctx, _scope(ctx, line, function)) if (b.end_lineno or 0) < line]
    return max(ended, key=lambda b: b.lineno, default=None)


def _header(node: ast.stmt | ast.expr) -> str:
    """`with torch.no_grad():` or `@torch.no_grad()`, as written but without its comment."""
    if isinstance(node, (ast.With, ast.AsyncWith)):
        items = ", ".join(ast.unparse(item) for item in node.items)
        return f"{'async ' if isinstance(node, ast.AsyncWith) else ''}with {items}:"
    return f"@{ast.unparse(node)}"
