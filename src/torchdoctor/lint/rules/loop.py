"""TD4xx the training loop: gradients never cleared, clipping scaled gradients, anomaly
detection left on."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchdoctor.lint.context import (
    FileContext,
    Hit,
    is_const,
    keyword,
    method,
    receiver,
)
from torchdoctor.lint.engine import Rule
from torchdoctor.lint.rules._patterns import (
    in_if,
    is_backward,
    is_optimizer_step,
    is_zero_grad,
    loop_calls,
    optimizer_names,
)


def _qualifies(ctx: FileContext, loop: ast.AST, optimizers: set[str]) -> bool:
    nodes = loop_calls(loop)
    steps = [n for n in nodes if is_optimizer_step(ctx, n, optimizers)]
    if not steps or not any(is_backward(ctx, n) for n in nodes):
        return False
    if any(
        isinstance(s, ast.Call)
        and s.args
        and method(s) == "step"
        and "scaler"
        not in (
            ast.unparse(receiver(s) or s).lower()  # optimizer.step(closure): the closure clears
        )
        for s in steps
    ):
        return False
    return not any(is_zero_grad(n) for n in nodes)


def _missing_zero_grad(ctx: FileContext) -> Iterator[Hit]:
    optimizers = optimizer_names(ctx)
    flagged = [loop for loop in ctx.loops() if _qualifies(ctx, loop, optimizers)]
    for loop in flagged:
        inner = [other for other in flagged if other is not loop and loop in ctx.ancestors(other)]
        if not inner:
            yield Hit(loop)


MISSING_ZERO_GRAD = Rule(
    code="TD401",
    name="missing-zero-grad",
    message="loop calls backward() and optimizer.step() but never clears gradients (zero_grad)",
    what=(
        "A loop whose body calls backward() and an optimizer's step() but no zero_grad() "
        "(on the optimizer or the model) and never sets .grad to None. Gradient accumulation "
        "that clears every N steps inside the loop is fine."
    ),
    why=(
        "backward() adds to .grad, it does not overwrite it. Without clearing, each step's "
        "update uses the sum of all gradients so far: the effective learning rate grows "
        "every step and training diverges or stalls."
    ),
    example=(
        "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()"
    ),
    fix=(
        "for x, y in loader:\n"
        "    optimizer.zero_grad(set_to_none=True)\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()"
    ),
    check=_missing_zero_grad,
)

_CLIP = ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value")


def _is_scaled_backward(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or method(node) != "backward":
        return False
    inner = receiver(node)
    return isinstance(inner, ast.Call) and method(inner) == "scale"


def _is_clip(ctx: FileContext, node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = ctx.call_name(node) or ""
    last = name.rsplit(".", 1)[-1] if name else (method(node) or "")
    return last in _CLIP or method(node) in _CLIP


def _clip_without_unscale(ctx: FileContext) -> Iterator[Hit]:
    for scope in ctx.scopes():
        nodes = ctx.scope_nodes(scope)
        scaled = [n for n in nodes if _is_scaled_backward(n)]
        if not scaled:
            continue
        unscales = [n for n in nodes if isinstance(n, ast.Call) and method(n) == "unscale_"]
        first_scaled = min(getattr(n, "lineno", 0) for n in scaled)
        for n in nodes:
            if not _is_clip(ctx, n) or getattr(n, "lineno", 0) < first_scaled:
                continue
            if not any(u.lineno <= n.lineno for u in unscales):  # type: ignore[attr-defined]
                yield Hit(n)


CLIP_WITHOUT_UNSCALE = Rule(
    code="TD402",
    name="clip-without-unscale",
    message="gradients clipped while still scaled: call scaler.unscale_(optimizer) before clipping",
    what=(
        "clip_grad_norm_ / clip_grad_value_ in code that backpropagates through "
        "scaler.scale(loss), without scaler.unscale_(optimizer) before the clip."
    ),
    why=(
        "With a GradScaler the gradients are multiplied by the loss scale (65536 at the "
        "start). Clipping them at max_norm=1.0 then clips almost everything to a tiny "
        "fraction of its true size, and the threshold means something different every time "
        "the scale changes."
    ),
    example=(
        "scaler.scale(loss).backward()\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "scaler.step(optimizer)\n"
        "scaler.update()"
    ),
    fix=(
        "scaler.scale(loss).backward()\n"
        "scaler.unscale_(optimizer)\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "scaler.step(optimizer)\n"
        "scaler.update()"
    ),
    check=_clip_without_unscale,
)

_SET_ANOMALY = (
    "torch.autograd.set_detect_anomaly",
    "torch.autograd.anomaly_mode.set_detect_anomaly",
)
_DETECT_ANOMALY = ("torch.autograd.detect_anomaly", "torch.autograd.anomaly_mode.detect_anomaly")


def _anomaly(ctx: FileContext) -> Iterator[Hit]:
    for n in ctx.nodes(ast.Call):
        assert isinstance(n, ast.Call)
        name = ctx.call_name(n)
        scoped = isinstance(ctx.parent(n), ast.withitem)  # `with set_detect_anomaly(True):`
        if name in _SET_ANOMALY and not scoped:
            value = n.args[0] if n.args else keyword(n, "mode")
            if is_const(value, True) and in_if(ctx, n) is None:
                yield Hit(n)
        elif name in _DETECT_ANOMALY or (name in _SET_ANOMALY and scoped):
            value = n.args[0] if n.args else keyword(n, "mode")
            if name in _SET_ANOMALY and not is_const(value, True):
                continue
            parent = ctx.parent(n)
            if not isinstance(parent, ast.withitem) or in_if(ctx, n) is not None:
                continue
            with_node = ctx.parent(parent)
            wraps_loop = any(
                isinstance(x, (ast.For, ast.AsyncFor, ast.While))
                for x in ast.walk(with_node)  # type: ignore[arg-type]
            )
            if wraps_loop or ctx.enclosing_loop(n) is not None:
                yield Hit(
                    n,
                    "detect_anomaly() around every step slows training many times "
                    "over; keep it to the one step you are debugging",
                )


ANOMALY_LEFT_ON = Rule(
    code="TD403",
    name="anomaly-detection-left-on",
    message="anomaly detection left on for the whole run: a debugging aid that slows every step",
    what=(
        "torch.autograd.set_detect_anomaly(True) outside any `if` (an unconditional switch), "
        "or `with torch.autograd.detect_anomaly():` around a loop or inside the training loop."
    ),
    why=(
        "Anomaly mode records a stack trace for every forward operation and checks every "
        "backward result: steps run several times slower (5-10x is common). It is for "
        "finding the operation that produces a NaN in one step, not for training."
    ),
    example="torch.autograd.set_detect_anomaly(True)\nfor x, y in loader:\n    ...",
    fix=(
        "if args.debug_nan:\n"
        "    torch.autograd.set_detect_anomaly(True)\n"
        "# or around a single suspicious step:\n"
        "with torch.autograd.detect_anomaly():\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()"
    ),
    check=_anomaly,
)

RULES = (MISSING_ZERO_GRAD, CLIP_WITHOUT_UNSCALE, ANOMALY_LEFT_ON)
