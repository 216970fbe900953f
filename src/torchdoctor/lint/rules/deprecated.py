"""TD6xx deprecated APIs."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.lint.context import FileContext, terminal, text
from torchdoctor.lint.rule import Hit, Rule

_AMP_MODULES = ("torch.cuda.amp", "torch.cpu.amp")
_REPLACEMENTS = {
    "autocast": 'torch.amp.autocast("{device}", ...)',
    "GradScaler": 'torch.amp.GradScaler("{device}")',
    "custom_fwd": 'torch.amp.custom_fwd(device_type="{device}")',
    "custom_bwd": 'torch.amp.custom_bwd(device_type="{device}")',
}


def _replacement(module: str, name: str) -> str:
    device = module.split(".")[1]
    template = _REPLACEMENTS.get(name, "torch.amp")
    return template.format(device=device)


def _fallback(ctx: FileContext, node: ast.AST) -> bool:
    """Inside an `except` whose `try` uses torch.amp, or in a branch of an `if` that tests
    for the new API (hasattr(torch, "amp"), a version check): code for old PyTorch only."""
    child = node
    for a in ctx.ancestors(node):
        if (
            isinstance(a, ast.Try)
            and child in a.handlers
            and any("amp" in text(stmt) for stmt in a.body)
        ):
            return True
        if isinstance(a, ast.If) and _NEW_API_TEST.search(text(a.test)):
            return True
        child = a
    return False


_NEW_API_TEST = re.compile(r"hasattr\(torch|torch\.amp|__version__|version")


def _cuda_amp(ctx: FileContext) -> Iterator[Hit]:
    for hit in _cuda_amp_uses(ctx):
        if not _fallback(ctx, hit.node):
            yield hit


def _cuda_amp_uses(ctx: FileContext) -> Iterator[Hit]:
    for n in ctx.all_nodes:
        if isinstance(n, ast.ImportFrom) and n.module in _AMP_MODULES and n.level == 0:
            names = ", ".join(a.name for a in n.names)
            repl = "; ".join(_replacement(n.module, a.name) for a in n.names)
            yield Hit(n, f"{n.module} ({names}) is deprecated: use {repl}")
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name in _AMP_MODULES and a.asname:
                    yield Hit(n, f"{a.name} is deprecated: use torch.amp")
        elif isinstance(n, ast.Attribute):
            name = ctx.qualname(n)
            if name is None or isinstance(ctx.parent(n), ast.Attribute):
                continue
            module, _, attr = name.rpartition(".")
            if module in _AMP_MODULES and attr in _REPLACEMENTS:
                yield Hit(n, f"{name} is deprecated: use {_replacement(module, attr)}")


DEPRECATED_AMP = Rule(
    code="TD601",
    name="deprecated-cuda-amp",
    message="torch.cuda.amp is deprecated: use torch.amp with a device type",
    what=(
        "torch.cuda.amp.autocast, torch.cuda.amp.GradScaler, torch.cuda.amp.custom_fwd/"
        "custom_bwd (and torch.cpu.amp.autocast), used or imported. A fallback for old "
        "PyTorch (in the `except` after torch.amp was tried, or under a version or "
        "hasattr check) is not reported."
    ),
    why=(
        "These device-specific entry points are deprecated in favour of torch.amp, which "
        "takes the device type as an argument; they emit FutureWarnings and will be removed. "
        "The torch.amp forms work the same on CUDA, CPU, XPU and MPS."
    ),
    example=(
        "scaler = torch.cuda.amp.GradScaler()\n"
        "with torch.cuda.amp.autocast():\n"
        "    loss = criterion(model(x), y)"
    ),
    fix=(
        'scaler = torch.amp.GradScaler("cuda")\n'
        'with torch.autocast("cuda", dtype=torch.float16):\n'
        "    loss = criterion(model(x), y)"
    ),
    check=_cuda_amp,
)


def _variable(ctx: FileContext) -> Iterator[Hit]:
    for n in ctx.all_nodes:
        if isinstance(n, ast.ImportFrom) and n.module == "torch.autograd" and n.level == 0:
            if any(a.name == "Variable" for a in n.names):
                yield Hit(n)
        elif (
            isinstance(n, ast.Attribute)
            and not isinstance(ctx.parent(n), ast.Attribute)
            and ctx.qualname(n) in ("torch.autograd.Variable", "torch.autograd.variable.Variable")
        ):
            yield Hit(n)


DEPRECATED_VARIABLE = Rule(
    code="TD602",
    name="deprecated-variable",
    message="torch.autograd.Variable is deprecated since PyTorch 0.4: use tensors directly",
    what="torch.autograd.Variable imported or used.",
    why=(
        "Since PyTorch 0.4 tensors carry autograd themselves; Variable(x) just returns a "
        "tensor, and its old arguments (volatile=True) no longer do anything, so code that "
        "relies on them silently records graphs it meant to skip."
    ),
    example="from torch.autograd import Variable\nx = Variable(x, volatile=True)",
    fix=(
        "x = x.requires_grad_()  # when a gradient is needed\n"
        "with torch.no_grad():  # instead of volatile=True\n"
        "    out = model(x)"
    ),
    check=_variable,
)

_LOSS_NAME = re.compile(r"(?i)loss|cost")
_REDUCTIONS = ("sum", "mean", "item", "norm")


def _reduced(node: ast.AST | None) -> bool:
    """x.sum() / x.mean() / (a == b).float().mean() with no dim: a 0-dim result."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _REDUCTIONS
        and not node.args
        and not node.keywords
    )


def _zero_dim(ctx: FileContext, owner: ast.AST) -> bool:
    """A loss (by name), a reduction without dim, or a name last assigned one."""
    if _LOSS_NAME.search(terminal(owner) or "") or _reduced(owner):
        return True
    if isinstance(owner, ast.Name):
        value = ctx.value_before(ctx.scope(owner), owner.id, getattr(owner, "lineno", 0))
        while isinstance(value, ast.BinOp):  # correct.float() / n
            value = value.left
        return _reduced(value)
    return False


def _zero_dim_index(ctx: FileContext) -> Iterator[Hit]:
    for n in ctx.nodes(ast.Subscript):
        assert isinstance(n, ast.Subscript)
        if not (isinstance(n.slice, ast.Constant) and n.slice.value == 0):
            continue
        data = n.value
        if not (isinstance(data, ast.Attribute) and data.attr == "data"):
            continue
        if _zero_dim(ctx, data.value):
            yield Hit(
                n,
                f"`{text(n)}` indexes a 0-dim tensor: IndexError since PyTorch 0.5; "
                f"use `{text(data.value)}.item()`",
            )


ZERO_DIM_INDEX = Rule(
    code="TD603",
    name="loss-data-index",
    message="loss.data[0] indexes a 0-dim tensor (an error since PyTorch 0.5): use loss.item()",
    what=(
        "`.data[0]` on a loss (a name with loss or cost in it) or on a reduction without a "
        "dim (x.sum(), (pred == y).sum(), or a name last assigned one): the PyTorch 0.3 "
        "way of reading a number."
    ),
    why=(
        "Before PyTorch 0.4 a loss was a 1-element Variable and `loss.data[0]` its value. "
        "Losses are 0-dim tensors now: indexing one raises `IndexError: invalid index of a "
        "0-dim tensor`, so old training code stops at its first logging line. `.data` also "
        "skips autograd's checks."
    ),
    example="running_loss += loss.data[0]",
    fix="running_loss += loss.item()",
    check=_zero_dim_index,
)

RULES = (DEPRECATED_AMP, DEPRECATED_VARIABLE, ZERO_DIM_INDEX)
