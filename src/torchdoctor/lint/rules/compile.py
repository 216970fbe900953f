"""TD3xx torch.compile: code inside compiled functions that breaks the graph.

Compiled code is a function decorated with @torch.compile (or torch._dynamo.optimize), a
function of this file passed to torch.compile(fn), and the forward of a module class of
this file whose instance is passed to torch.compile(...) or calls .compile(). Branches on
torch.compiler.is_compiling() and functions marked torch.compiler.disable are skipped.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchdoctor.lint.context import FileContext, method, receiver, terminal
from torchdoctor.lint.rule import Hit, Rule

_COMPILE = {"torch.compile", "torch._dynamo.optimize"}
_DISABLE = {"torch.compiler.disable", "torch._dynamo.disable"}
_DATA_METHODS = {
    "item",
    "any",
    "all",
    "sum",
    "mean",
    "max",
    "min",
    "amax",
    "amin",
    "norm",
    "allclose",
    "equal",
    "count_nonzero",
    "nonzero",
}
_DATA_FUNCTIONS = {f"torch.{m}" for m in _DATA_METHODS} | {
    "torch.isnan",
    "torch.isinf",
    "torch.isfinite",
}


def _decorator_name(ctx: FileContext, d: ast.AST) -> str | None:
    return ctx.qualname(d.func if isinstance(d, ast.Call) else d)


def _compiled_functions(ctx: FileContext) -> list[ast.AST]:
    functions: dict[str, ast.AST] = {}
    classes: dict[str, ast.ClassDef] = {}
    out: list[ast.AST] = []
    for n in ctx.all_nodes:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.setdefault(n.name, n)
            if any(_decorator_name(ctx, d) in _COMPILE for d in n.decorator_list):
                out.append(n)
        elif isinstance(n, ast.ClassDef):
            classes[n.name] = n
    instances: dict[str, str] = {}  # variable -> class of this file
    for n in ctx.nodes(ast.Assign):
        assert isinstance(n, ast.Assign)
        if isinstance(n.value, ast.Call) and terminal(n.value.func) in classes:
            for t in n.targets:
                instances[ast.unparse(t)] = terminal(n.value.func)  # type: ignore[assignment]

    def resolve(arg: ast.AST) -> list[ast.AST]:
        if isinstance(arg, ast.Name) and arg.id in functions and arg.id not in instances:
            return [functions[arg.id]]
        cls = None
        if isinstance(arg, ast.Call):
            cls = terminal(arg.func) if terminal(arg.func) in classes else None
        else:
            cls = instances.get(ast.unparse(arg))
        if cls is not None:
            return [
                m
                for m in classes[cls].body
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name == "forward"
            ]
        return []

    for n in ctx.nodes(ast.Call):
        assert isinstance(n, ast.Call)
        if ctx.call_name(n) == "torch.compile" and n.args:
            out += resolve(n.args[0])
        elif method(n) == "compile" and not n.args and receiver(n) is not None:
            out += resolve(receiver(n))  # type: ignore[arg-type]
    unique: list[ast.AST] = []
    for f in out:
        if f not in unique and not any(
            _decorator_name(ctx, d) in _DISABLE for d in getattr(f, "decorator_list", [])
        ):
            unique.append(f)
    return unique


def _is_compiling_test(ctx: FileContext, test: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and (terminal(n.func) or "") == "is_compiling"
        for n in ast.walk(test)
    )


def _compiled_nodes(ctx: FileContext) -> list[ast.AST]:
    """Every node that runs inside compiled code."""
    return ctx.memo("compiled_nodes", lambda: list(_walk_compiled(ctx)))


def _walk_compiled(ctx: FileContext) -> Iterator[ast.AST]:
    seen: set[int] = set()
    for function in _compiled_functions(ctx):
        stack: list[ast.AST] = list(getattr(function, "body", []))
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, ast.If) and _is_compiling_test(ctx, node.test):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                _decorator_name(ctx, d) in _DISABLE for d in node.decorator_list
            ):
                continue
            yield node
            stack.extend(ast.iter_child_nodes(node))


def _prints(ctx: FileContext) -> Iterator[Hit]:
    for n in _compiled_nodes(ctx):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id == "print"
            and "print" not in ctx.aliases
        ):
            yield Hit(n)


PRINT_IN_COMPILED = Rule(
    code="TD301",
    name="print-in-compiled-code",
    message="print() inside torch.compile'd code causes a graph break",
    what="A print() call inside a function compiled with torch.compile.",
    why=(
        "Dynamo cannot put print into a graph: the graph is split there and the rest runs "
        "as separate graphs with eager Python in between, on every call (with "
        "fullgraph=True it is an error). Printing a tensor also forces a device sync."
    ),
    example=("@torch.compile\ndef step(x):\n    y = model(x)\n    print(y.shape)\n    return y"),
    fix=(
        "@torch.compile\n"
        "def step(x):\n"
        "    return model(x)\n\n"
        "y = step(x)\n"
        "print(y.shape)  # outside the compiled function"
    ),
    check=_prints,
)


def _items(ctx: FileContext) -> Iterator[Hit]:
    for n in _compiled_nodes(ctx):
        if isinstance(n, ast.Call) and method(n) in ("item", "tolist") and not n.args:
            yield Hit(
                n,
                f".{method(n)}() inside torch.compile'd code: a graph break and a "
                "host-device sync; keep the value a tensor",
            )


ITEM_IN_COMPILED = Rule(
    code="TD302",
    name="item-in-compiled-code",
    message=".item() inside torch.compile'd code: a graph break and a host-device sync",
    what=".item() or .tolist() on a tensor inside a function compiled with torch.compile.",
    why=(
        "Turning a tensor into a Python number needs its value, which a traced graph does not "
        "have: Dynamo breaks the graph (unless capture_scalar_outputs is set) and the GPU "
        "must finish its work before Python can continue."
    ),
    example="@torch.compile\ndef scale(x):\n    return x / x.abs().max().item()",
    fix="@torch.compile\ndef scale(x):\n    return x / x.abs().max()  # stays a tensor",
    check=_items,
)


def _data_dependent(ctx: FileContext, test: ast.AST) -> bool:
    for n in ast.walk(test):
        if not isinstance(n, ast.Call):
            continue
        if ctx.call_name(n) in _DATA_FUNCTIONS:
            return True
        name = method(n)
        owner = receiver(n)
        if name in _DATA_METHODS and owner is not None and not _shape_like(owner):
            if (
                name in ("max", "min", "sum")
                and isinstance(owner, ast.Name)
                and owner.id
                in (
                    "math",
                    "np",
                    "numpy",
                )
            ):
                continue
            return True
    return False


def _shape_like(node: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Attribute) and n.attr in ("shape", "ndim", "dtype", "device"))
        or (isinstance(n, ast.Call) and method(n) in ("size", "dim", "numel"))
        for n in ast.walk(node)
    )


def _branches(ctx: FileContext) -> Iterator[Hit]:
    for n in _compiled_nodes(ctx):
        if isinstance(n, (ast.If, ast.While, ast.IfExp)) and _data_dependent(ctx, n.test):
            kind = "while" if isinstance(n, ast.While) else "if"
            yield Hit(
                n,
                f"`{kind}` on a tensor's value inside torch.compile'd code: a graph "
                "break (the graph cannot depend on data); use torch.where or torch.cond",
            )


BRANCH_IN_COMPILED = Rule(
    code="TD303",
    name="data-dependent-branch-in-compiled-code",
    message="Python branching on a tensor's value inside torch.compile'd code",
    what=(
        "An if, while or conditional expression inside a compiled function whose condition "
        "reads tensor values (x.sum() > 0, torch.isnan(x).any(), x.max() < t). Conditions on "
        "shapes, dtypes and Python values are fine."
    ),
    why=(
        "A graph cannot depend on data it has not computed yet: Dynamo breaks the graph at "
        "the branch, syncs with the device to read the value, and traces each side "
        "separately."
    ),
    example=("@torch.compile\ndef f(x):\n    if x.sum() > 0:\n        return x * 2\n    return x"),
    fix=(
        "@torch.compile\n"
        "def f(x):\n"
        "    return torch.where(x.sum() > 0, x * 2, x)  # or torch.cond for larger branches"
    ),
    check=_branches,
)

RULES = (PRINT_IN_COMPILED, ITEM_IN_COMPILED, BRANCH_IN_COMPILED)
