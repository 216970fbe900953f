"""What the rules know about one file: its tree, parents, imports and scopes.

Names are resolved through the file's imports (``import torch.nn.functional as F`` makes
``F.softmax`` mean ``torch.nn.functional.softmax``); the usual aliases F, nn, dist and optim
are assumed when the file uses them without importing them (snippets, notebooks).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
LOOPS = (ast.For, ast.AsyncFor, ast.While)

T = TypeVar("T")

_CONVENTIONS = {
    "torch": "torch",
    "F": "torch.nn.functional",
    "nn": "torch.nn",
    "dist": "torch.distributed",
    "optim": "torch.optim",
}

# Context managers and decorators under which autograd records nothing.
GRAD_OFF = (
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.no_grad",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
)


class FileContext:
    def __init__(self, path: str, source: str, tree: ast.Module) -> None:
        self.path = path
        self.source = source
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        self.all_nodes: list[ast.AST] = []
        self._by_type: dict[type, list[ast.AST]] = {}
        self._scope_nodes: dict[int, list[ast.AST]] = {id(tree): []}
        self._index(tree)
        self.aliases: dict[str, str] = {}
        self.bound: set[str] = set()
        self._loop_nodes: dict[tuple[int, bool], list[ast.AST]] = {}
        self._assigned: dict[int, dict[str, list[ast.expr]]] = {}
        self._bindings: dict[int, dict[str, list[tuple[int, ast.expr]]]] = {}
        self._calls_by_name: dict[str, list[ast.Call]] | None = None
        self._call_names: dict[int, str | None] = {}
        self._memo: dict[str, Any] = {}
        self._collect_names()

    def _index(self, tree: ast.Module) -> None:
        """One depth-first walk in source order: parents, nodes by type, and the nodes
        that run in each function (or the module), as walk_scope() gives them."""
        stack: list[tuple[ast.AST, ast.AST | None]] = [(tree, None)]
        while stack:
            node, scope = stack.pop()
            self.all_nodes.append(node)
            self._by_type.setdefault(type(node), []).append(node)
            if scope is not None and not isinstance(node, SCOPES):
                self._scope_nodes[id(scope)].append(node)
            inner: set[int] = set()
            child_scope: ast.AST | None
            if node is tree:
                inner, child_scope = {id(c) for c in tree.body}, tree
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._scope_nodes[id(node)] = []
                inner, child_scope = {id(c) for c in node.body}, node
            elif isinstance(node, ast.Lambda):
                self._scope_nodes[id(node)] = []
                inner, child_scope = {id(node.body)}, node
            elif isinstance(node, ast.ClassDef):
                child_scope = None  # class bodies run in no function the rules look at
            else:
                child_scope = scope
            scoped = isinstance(node, (ast.Module, *SCOPES))
            for child in reversed(list(ast.iter_child_nodes(node))):
                self.parents[child] = node
                if scoped:
                    stack.append((child, child_scope if id(child) in inner else None))
                else:
                    stack.append((child, child_scope))

    # --- names ---------------------------------------------------------------------------

    def _collect_names(self) -> None:
        for node in self.all_nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.aliases[a.asname] = a.name
                    else:
                        top = a.name.split(".")[0]
                        self.aliases[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    if a.name != "*":
                        self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.bound.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound.add(node.name)
            elif isinstance(node, ast.arg):
                self.bound.add(node.arg)

    def qualname(self, node: ast.AST | None) -> str | None:
        """The dotted name an expression refers to, through the imports; None when it is not
        a plain name or attribute chain."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base = self.aliases.get(node.id)
        if base is None:
            base = _CONVENTIONS.get(node.id) if node.id not in self.bound else None
        if base is None:
            base = node.id
        return ".".join([base, *reversed(parts)])

    def call_name(self, node: ast.AST) -> str | None:
        if not isinstance(node, ast.Call):
            return None
        key = id(node)
        if key not in self._call_names:
            self._call_names[key] = self.qualname(node.func)
        return self._call_names[key]

    def is_call(self, node: ast.AST, *names: str) -> bool:
        return self.call_name(node) in names

    # --- structure -----------------------------------------------------------------------

    def parent(self, node: ast.AST) -> ast.AST | None:
        return self.parents.get(node)

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        current = self.parents.get(node)
        while current is not None:
            yield current
            current = self.parents.get(current)

    def scope(self, node: ast.AST) -> ast.AST:
        """The function (or module) a node runs in."""
        for a in self.ancestors(node):
            if isinstance(a, FUNCTIONS):
                return a
        return self.tree

    def enclosing_loop(self, node: ast.AST) -> ast.AST | None:
        """The innermost loop around a node within its function."""
        for a in self.ancestors(node):
            if isinstance(a, SCOPES):
                return None
            if isinstance(a, LOOPS):
                return a
        return None

    def scopes(self) -> list[ast.AST]:
        return [self.tree, *self.nodes(FUNCTIONS)]

    def loops(self) -> list[ast.AST]:
        return list(self.nodes(LOOPS))

    def nodes(self, kind: type | tuple[type, ...]) -> Iterator[ast.AST]:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        for k in kinds:
            yield from self._by_type.get(k, ())

    def scope_nodes(self, scope: ast.AST) -> list[ast.AST]:
        """walk_scope(scope), computed once."""
        key = id(scope)
        if key not in self._scope_nodes:
            self._scope_nodes[key] = list(walk_scope(scope))
        return self._scope_nodes[key]

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """compute() once per file: what several rules derive from the same tree."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def loop_nodes(self, loop: ast.AST, direct: bool = False) -> list[ast.AST]:
        """The nodes that run in a loop's body (`direct`: not counting nested loops),
        computed once."""
        key = (id(loop), direct)
        if key not in self._loop_nodes:
            assert isinstance(loop, LOOPS)
            self._loop_nodes[key] = list(walk([*loop.body, *loop.orelse], skip_loops=direct))
        return self._loop_nodes[key]

    def calls_to(self, name: str) -> list[ast.Call]:
        """Calls of a function or method by its last name: `name(...)`, `self.name(...)`."""
        if self._calls_by_name is None:
            self._calls_by_name = {}
            for n in self.nodes(ast.Call):
                assert isinstance(n, ast.Call)
                last = terminal(n.func)
                if last:
                    self._calls_by_name.setdefault(last, []).append(n)
        return self._calls_by_name.get(name, [])

    def value_before(self, scope: ast.AST, name: str, line: int) -> ast.expr | None:
        """The value last bound to a plain name in the scope on a line before `line`
        (None when there is none, or when the binding has no single value)."""
        key = id(scope)
        if key not in self._bindings:
            self._bindings[key] = _binding_lines(self.scope_nodes(scope))
        before = [(ln, v) for ln, v in self._bindings[key].get(name, []) if ln < line]
        if not before:
            return None
        value = max(before, key=lambda b: b[0])[1]
        return None if is_const(value, None) and not hasattr(value, "lineno") else value

    def assigned(self, scope: ast.AST, name: str) -> list[ast.expr]:
        """The values bound to a plain name in a scope (a Constant(None) stands for bindings
        without a value: loop targets, tuple unpacking, with ... as)."""
        key = id(scope)
        if key not in self._assigned:
            self._assigned[key] = _assignment_map(self.scope_nodes(scope))
        return self._assigned[key].get(name, [])


def _assignment_map(nodes: Iterable[ast.AST]) -> dict[str, list[ast.expr]]:
    out: dict[str, list[ast.expr]] = {}
    unknown = ast.Constant(value=None)

    def bind(target: ast.AST | None, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            out.setdefault(target.id, []).append(value)
        elif target is not None:
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    out.setdefault(n.id, []).append(unknown)

    for n in nodes:
        if isinstance(n, ast.Assign):
            for t in n.targets:
                bind(t, n.value)
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)):
            bind(n.target, n.value if n.value is not None else unknown)
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.NamedExpr)):
            bind(n.target, unknown)
        elif isinstance(n, ast.withitem):
            bind(n.optional_vars, unknown)
    return out


def _binding_lines(nodes: Iterable[ast.AST]) -> dict[str, list[tuple[int, ast.expr]]]:
    out: dict[str, list[tuple[int, ast.expr]]] = {}
    unknown = ast.Constant(value=None)  # no lineno: "bound, value unknown"
    for n in nodes:
        line = getattr(n, "lineno", 0)
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    out.setdefault(t.id, []).append((line, n.value))
                else:
                    for x in ast.walk(t):
                        if isinstance(x, ast.Name):
                            out.setdefault(x.id, []).append((line, unknown))
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
            for x in ast.walk(n.target):
                if isinstance(x, ast.Name):
                    value = getattr(n, "value", None)
                    plain = isinstance(n, (ast.AnnAssign, ast.NamedExpr)) and value is not None
                    out.setdefault(x.id, []).append((line, value if plain else unknown))  # type: ignore[arg-type]
        elif isinstance(n, ast.withitem) and n.optional_vars is not None:
            for x in ast.walk(n.optional_vars):
                if isinstance(x, ast.Name):
                    out.setdefault(x.id, []).append((getattr(n.context_expr, "lineno", 0), unknown))
    return out


def body_of(node: ast.AST) -> list[ast.stmt]:
    if isinstance(node, ast.Module):
        return node.body
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return node.body
    if isinstance(node, ast.Lambda):
        return []
    if isinstance(node, LOOPS):
        return [*node.body, *node.orelse]
    return [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]


def walk(nodes: Iterable[ast.AST], skip_loops: bool = False) -> Iterator[ast.AST]:
    """Every node under `nodes` without entering nested functions or classes (and, with
    `skip_loops`, nested loops)."""

    def keep(node: ast.AST) -> bool:
        return not isinstance(node, SCOPES) and not (skip_loops and isinstance(node, LOOPS))

    stack = [n for n in nodes if keep(n)][::-1]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in reversed(list(ast.iter_child_nodes(node))) if keep(c))


def walk_scope(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes that run in a function (or the module), nested functions left out."""
    if isinstance(scope, ast.Lambda):
        return walk([scope.body])
    return walk(body_of(scope))


def method(node: ast.AST) -> str | None:
    """For a call `x.name(...)`, the name."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def receiver(node: ast.AST) -> ast.expr | None:
    """For a call `x.name(...)`, x."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.value
    return None


def terminal(node: ast.AST | None) -> str | None:
    """The last name of a Name/Attribute chain: `self.opt` -> 'opt'."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


@functools.lru_cache(maxsize=1 << 16)
def text(node: ast.AST) -> str:
    """The node as source (cached: the rules compare the same expressions many times)."""
    return ast.unparse(node)


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    return any(kw.arg is None for kw in call.keywords)


def is_const(node: ast.AST | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
