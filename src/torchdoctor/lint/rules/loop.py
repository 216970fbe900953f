"""TD4xx the training loop: gradients never cleared, clipping scaled gradients, anomaly
detection left on."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.lint.context import (
    FileContext,
    is_const,
    keyword,
    method,
    receiver,
    terminal,
    text,
    walk,
)
from torchdoctor.lint.rule import Hit, Rule
from torchdoctor.lint.rules._patterns import (
    exclusive,
    in_except,
    in_if,
    in_periodic_if,
    is_backward,
    is_optimizer_step,
    is_zero_grad,
    mode_switches,
    optimizer_names,
)


def _qualifies(ctx: FileContext, loop: ast.AST, optimizers: set[str]) -> bool:
    nodes = ctx.loop_nodes(loop)
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
        for n in nodes:
            if not _is_clip(ctx, n):
                continue
            # Only a scaled backward() on the same path counts: not one in the other
            # branch of `if use_amp: ... else: ...`.
            line = getattr(n, "lineno", 0)
            if not any(s.lineno <= line and not exclusive(ctx, s, n) for s in scaled):  # type: ignore[attr-defined]
                continue
            if not any(u.lineno <= line and not exclusive(ctx, u, n) for u in unscales):
                yield Hit(n)


CLIP_WITHOUT_UNSCALE = Rule(
    code="TD402",
    name="clip-without-unscale",
    message="gradients clipped while still scaled: call scaler.unscale_(optimizer) before clipping",
    what=(
        "clip_grad_norm_ / clip_grad_value_ after a backward through scaler.scale(loss) on "
        "the same path (not in the other branch of an `if use_amp:`), without "
        "scaler.unscale_(optimizer) before the clip."
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


_VALIDATION = re.compile(r"(?i)(?:^|[^a-z])(?:val|valid|validation|test|eval|dev)(?:[^a-z]|$)")
_TRAINING = re.compile(r"(?i)train")


def _validation_loop(loop: ast.AST) -> bool:
    """`for x, y in val_loader:` and the like (not a training loader)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    source = text(loop.iter)
    return bool(_VALIDATION.search(source)) and not _TRAINING.search(source)


def _validation_in_train_mode(ctx: FileContext) -> Iterator[Hit]:
    optimizers = optimizer_names(ctx)
    for scope in ctx.scopes():
        nodes = ctx.scope_nodes(scope)
        switches = mode_switches(nodes)
        if not switches:
            continue
        reported: set[tuple[str, int]] = set()
        for loop in [n for n in nodes if _validation_loop(n)]:
            body = ctx.loop_nodes(loop)
            if any(is_backward(ctx, n) or is_optimizer_step(ctx, n, optimizers) for n in body):
                continue
            for n in body:
                if not isinstance(n, ast.Call) or not isinstance(n.func, (ast.Name, ast.Attribute)):
                    continue
                called = text(n.func)
                before = [(line, e) for line, t, e in switches if t == called and line < n.lineno]
                # The scope itself put the model in training mode and never switched it
                # to eval mode before this loop.
                if not before or before[-1][1] or (called, before[-1][0]) in reported:
                    continue
                reported.add((called, before[-1][0]))
                yield Hit(
                    n,
                    f"`{called}` is still in training mode (train() on line {before[-1][0]}) "
                    "in this validation loop: dropout stays on and batch norm uses and "
                    "updates batch statistics; call "
                    f"{called}.eval() before it (and {called}.train() after)",
                )


VALIDATION_IN_TRAIN_MODE = Rule(
    code="TD404",
    name="validation-in-train-mode",
    message="validation runs the model in training mode: call model.eval() first",
    what=(
        "A loop over a validation or test loader (`val_loader`, `test_dl`, "
        "`dataloaders['val']`) without backward() or an optimizer step, that calls a model "
        "which the same function (or script) put in training mode with model.train() and "
        "never switched to model.eval() before the loop."
    ),
    why=(
        "In training mode dropout keeps dropping activations and batch norm normalises with "
        "the statistics of the current batch and updates its running averages with the "
        "validation data. Validation scores come out noisy and worse than the model is, "
        "and the running statistics used later for inference drift towards the "
        "validation set."
    ),
    example=(
        "for epoch in range(epochs):\n"
        "    model.train()\n"
        "    for x, y in train_loader:\n"
        "        optimizer.zero_grad()\n"
        "        criterion(model(x), y).backward()\n"
        "        optimizer.step()\n"
        "    with torch.no_grad():\n"
        "        for x, y in val_loader:\n"
        "            val_loss = criterion(model(x), y)"
    ),
    fix=(
        "for epoch in range(epochs):\n"
        "    model.train()\n"
        "    for x, y in train_loader:\n"
        "        optimizer.zero_grad()\n"
        "        criterion(model(x), y).backward()\n"
        "        optimizer.step()\n"
        "    model.eval()\n"
        "    with torch.no_grad():\n"
        "        for x, y in val_loader:\n"
        "            val_loss = criterion(model(x), y)"
    ),
    check=_validation_in_train_mode,
)

_SCHEDULER_NAME = re.compile(r"(?i)sched|lr_scheduler")
_SCHEDULER_CLASS = re.compile(r"(?:LR|Scheduler|Annealing\w*|WarmRestarts)$")


def _scheduler_names(ctx: FileContext) -> set[str]:
    out: set[str] = set()
    for n in ctx.nodes(ast.Assign):
        assert isinstance(n, ast.Assign)
        name = ctx.call_name(n.value) or ""
        if ".lr_scheduler." in name or _SCHEDULER_CLASS.search(name.rsplit(".", 1)[-1]):
            if "ReduceLROnPlateau" in name:
                continue
            out |= {t for t in (terminal(x) for x in n.targets) if t}
    return out


def _is_scheduler_step(node: ast.AST, schedulers: set[str]) -> bool:
    if not isinstance(node, ast.Call) or method(node) != "step" or node.args or node.keywords:
        return False
    owner = terminal(receiver(node)) or ""
    return owner in schedulers or bool(
        _SCHEDULER_NAME.search(owner) and "plateau" not in owner.lower()
    )


def _scheduler_before_optimizer(ctx: FileContext) -> Iterator[Hit]:
    optimizers = optimizer_names(ctx)
    schedulers = _scheduler_names(ctx)
    for loop in ctx.loops():
        assert isinstance(loop, (ast.For, ast.AsyncFor, ast.While))
        body = loop.body
        steps = [
            i
            for i, stmt in enumerate(body)
            if any(is_optimizer_step(ctx, n, optimizers) for n in walk([stmt]))
        ]
        if not steps:
            continue
        for stmt in body[: steps[0]]:
            for n in walk([stmt]):
                if _is_scheduler_step(n, schedulers) and ctx.enclosing_loop(n) is loop:
                    yield Hit(n)


SCHEDULER_BEFORE_OPTIMIZER = Rule(
    code="TD405",
    name="scheduler-step-before-optimizer-step",
    message="scheduler.step() before optimizer.step(): the first learning rate is skipped",
    what=(
        "In a loop, a learning-rate scheduler's step() that comes before the optimizer's "
        "step() in the same iteration (typically at the top of the epoch loop, with the "
        "batch loop below). ReduceLROnPlateau and step(metric) calls are not reported."
    ),
    why=(
        "Since PyTorch 1.1 the scheduler must step after the optimizer. Stepping it first "
        "moves the schedule on before any update used it: the initial learning rate (the "
        "first warm-up value, the first step of a decay) is never used, and the whole "
        "schedule runs one step early. PyTorch warns about it once, easy to miss."
    ),
    example=(
        "for epoch in range(epochs):\n"
        "    scheduler.step()\n"
        "    for x, y in loader:\n"
        "        optimizer.zero_grad()\n"
        "        criterion(model(x), y).backward()\n"
        "        optimizer.step()"
    ),
    fix=(
        "for epoch in range(epochs):\n"
        "    for x, y in loader:\n"
        "        optimizer.zero_grad()\n"
        "        criterion(model(x), y).backward()\n"
        "        optimizer.step()\n"
        "    scheduler.step()"
    ),
    check=_scheduler_before_optimizer,
)


def _clip_every_micro_step(ctx: FileContext) -> Iterator[Hit]:
    optimizers = optimizer_names(ctx)
    for loop in ctx.loops():
        nodes = ctx.loop_nodes(loop, direct=True)
        steps = [n for n in nodes if is_optimizer_step(ctx, n, optimizers)]
        if not steps or not all(in_periodic_if(ctx, s, loop) for s in steps):
            continue
        backwards = [n for n in nodes if is_backward(ctx, n) and not in_periodic_if(ctx, n, loop)]
        if not backwards:
            continue
        for n in nodes:
            if (
                _is_clip(ctx, n)
                and not in_periodic_if(ctx, n, loop)
                and not in_except(ctx, n)
                and in_if(ctx, n, loop) is None
            ):
                yield Hit(n)


CLIP_EVERY_MICRO_STEP = Rule(
    code="TD406",
    name="clip-every-micro-step",
    message="gradients clipped on every micro-step of gradient accumulation: clip before step",
    what=(
        "Gradient accumulation (backward() on every iteration, optimizer.step() only under "
        "`if (i + 1) % accum_steps == 0:`) with clip_grad_norm_ / clip_grad_value_ called "
        "on every iteration, outside that `if`."
    ),
    why=(
        "Clipping a partial sum of gradients scales down the micro-batches seen so far and "
        "not the ones still to come: the accumulated gradient is no longer the full batch's "
        "gradient, the effective threshold depends on the accumulation step, and the clip "
        "runs (with its device sync for the norm) accum_steps times per update."
    ),
    example=(
        "for i, (x, y) in enumerate(loader):\n"
        "    (criterion(model(x), y) / accum).backward()\n"
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    if (i + 1) % accum == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()"
    ),
    fix=(
        "for i, (x, y) in enumerate(loader):\n"
        "    (criterion(model(x), y) / accum).backward()\n"
        "    if (i + 1) % accum == 0:\n"
        "        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()"
    ),
    check=_clip_every_micro_step,
)

RULES = (
    MISSING_ZERO_GRAD,
    CLIP_WITHOUT_UNSCALE,
    ANOMALY_LEFT_ON,
    VALIDATION_IN_TRAIN_MODE,
    SCHEDULER_BEFORE_OPTIMIZER,
    CLIP_EVERY_MICRO_STEP,
)
