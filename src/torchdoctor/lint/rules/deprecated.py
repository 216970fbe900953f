"""TD6xx deprecated APIs."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchdoctor.lint.context import FileContext, Hit
from torchdoctor.lint.engine import Rule

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


def _cuda_amp(ctx: FileContext) -> Iterator[Hit]:
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
        "custom_bwd (and torch.cpu.amp.autocast), used or imported."
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

RULES = (DEPRECATED_AMP, DEPRECATED_VARIABLE)
