"""TD1xx memory: graphs kept alive across steps, cache flushing in the loop, evaluation that
records a graph."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.lint.context import (
    FileContext,
    Hit,
    method,
    names_in,
    receiver,
    terminal,
    text,
)
from torchdoctor.lint.engine import Rule
from torchdoctor.lint.rules._patterns import (
    backward_operands,
    disables_grad_globally,
    grad_disabled,
    in_except,
    in_periodic_if,
    is_backward,
    is_optimizer_step,
    loop_calls,
    optimizer_names,
)

_LOSS_CALL = re.compile(r"(?i)loss|criterion|cross_entropy|nll|mse|bce")
_DETACHING = {"item", "detach", "tolist", "numpy", "cpu"}
_EVAL_FUNCTION = re.compile(r"(?i)eval|valid|test|predict|infer")


def _loss_names(ctx: FileContext, loop: ast.AST) -> set[str]:
    """Names in a loop that hold a loss with its graph: differentiated in the loop, or (outside
    grad-free code) computed by a loss function or criterion."""
    nodes = loop_calls(loop)
    names: set[str] = set()
    for n in nodes:
        if is_backward(ctx, n):
            assert isinstance(n, ast.Call)
            names |= backward_operands(ctx, n)
    scope = ctx.scope(loop)
    function_name = getattr(scope, "name", "")
    for n in nodes:
        if (
            isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Call)
            and _LOSS_CALL.search(terminal(n.value.func) or "")
            and not grad_disabled(ctx, n)
            and not _EVAL_FUNCTION.search(function_name)
        ):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    # A name turned into a number in the loop (loss = loss.item()) holds no graph.
    for n in nodes:
        if (
            isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Call)
            and (method(n.value) in _DETACHING or terminal(n.value.func) in ("float", "int"))
        ):
            names -= {t.id for t in n.targets if isinstance(t, ast.Name)}
    return names


def _differentiated_names(ctx: FileContext, scope: ast.AST) -> set[str]:
    """Names whose values flow into a backward() in the scope, directly or through
    assignments (total = sum(losses); total.backward() counts `losses`)."""
    nodes = ctx.scope_nodes(scope)
    out: set[str] = set()
    for n in nodes:
        if is_backward(ctx, n):
            assert isinstance(n, ast.Call)
            target = receiver(n) if method(n) == "backward" else None
            out |= names_in(target) if target is not None else set()
            out |= {a.id for arg in n.args for a in ast.walk(arg) if isinstance(a, ast.Name)}
    assigns = [n for n in nodes if isinstance(n, (ast.Assign, ast.AugAssign))]
    for _ in range(5):
        before = len(out)
        for n in assigns:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(t.id in out for t in targets if isinstance(t, ast.Name)):
                out |= names_in(n.value)
        if len(out) == before:
            break
    return out


def _graph_ref(expr: ast.AST, names: set[str]) -> str | None:
    """The loss name if the expression keeps it as a tensor (not through .item() etc.)."""
    if isinstance(expr, ast.Name) and expr.id in names:
        return expr.id
    if isinstance(expr, ast.BinOp):
        return _graph_ref(expr.left, names) or _graph_ref(expr.right, names)
    if isinstance(expr, ast.UnaryOp):
        return _graph_ref(expr.operand, names)
    return None


def _reset_in(loop: ast.AST, target: str) -> bool:
    """The loop itself rebinds or clears the collection (`total = 0`, `losses = []`,
    `losses.clear()` after logging): what it keeps is bounded by the steps in between."""
    for n in loop_calls(loop, direct=True):
        if isinstance(n, ast.Assign) and any(text(t) == target for t in n.targets):
            return True
        if isinstance(n, ast.Call) and method(n) == "clear" and text(receiver(n) or n) == target:
            return True
    return False


def _kept_losses(ctx: FileContext) -> Iterator[Hit]:
    for loop in ctx.loops():
        losses = _loss_names(ctx, loop)
        if not losses:
            continue
        used_in_backward = _differentiated_names(ctx, ctx.scope(loop))
        for n in loop_calls(loop, direct=True):
            if (
                isinstance(n, ast.Call)
                and method(n) in ("append", "extend", "insert")
                and n.args
                and not grad_disabled(ctx, n)
            ):
                arg = n.args[-1]
                if isinstance(arg, (ast.List, ast.Tuple)) and arg.elts:
                    arg = arg.elts[0]
                name = _graph_ref(arg, losses)
                owner = terminal(receiver(n))
                collection = text(receiver(n) or n)
                if name and owner not in used_in_backward and not _reset_in(loop, collection):
                    yield Hit(
                        n,
                        f"`{text(n)}` keeps the loss tensor and its whole autograd graph alive "
                        f"across steps; store `{name}.item()` (or `{name}.detach()`)",
                    )


LOSS_KEPT = Rule(
    code="TD101",
    name="loss-kept-across-steps",
    message="a loss tensor is stored across steps with its autograd graph; store loss.item()",
    what=(
        "A training loop that appends the loss tensor itself (not a number) to a list: "
        "`losses.append(loss)`."
    ),
    why=(
        "A loss tensor keeps its autograd graph alive. Until backward() runs on it (or "
        "forever, in a loop that never calls backward, such as evaluation without no_grad) "
        "that graph holds the step's saved activations; after backward() the graph's nodes "
        "and the tensor itself stay on the device. Keeping one per step makes memory grow "
        "with every iteration, and reading them later forces a device sync per value."
    ),
    example=(
        "losses = []\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "    losses.append(loss)"
    ),
    fix="losses.append(loss.item())  # a Python float; or loss.detach() to keep a tensor",
    check=_kept_losses,
)


def _accumulated_losses(ctx: FileContext) -> Iterator[Hit]:
    for loop in ctx.loops():
        losses = _loss_names(ctx, loop)
        if not losses:
            continue
        differentiated = _differentiated_names(ctx, ctx.scope(loop))
        for n in loop_calls(loop, direct=True):
            if not isinstance(n, ast.AugAssign) or not isinstance(n.op, (ast.Add, ast.Sub)):
                continue
            target = terminal(n.target)
            name = _graph_ref(n.value, losses)
            if (
                name
                and target
                and target not in losses
                and target not in differentiated
                and not grad_disabled(ctx, n)
                and not _reset_in(loop, text(n.target))
            ):
                yield Hit(
                    n,
                    f"`{text(n)}` adds the loss tensor, not its value: `{target}` becomes a "
                    f"tensor that chains every step's graph; use `{name}.item()`",
                )


LOSS_ACCUMULATED = Rule(
    code="TD102",
    name="loss-accumulated-as-tensor",
    message="a running total adds the loss tensor, chaining every step's graph; add loss.item()",
    what=(
        "A running total updated with the loss tensor in a training loop: "
        "`running_loss += loss` (also `+= loss * x.size(0)`)."
    ),
    why=(
        "Adding a tensor that requires grad to a Python number turns the total into a tensor "
        "with a grad_fn; every step links its graph to the previous ones, so nothing from "
        "earlier steps can be freed (the graph nodes, and the activations of any step not "
        "yet backpropagated). Memory grows every iteration. Totals that the loop itself "
        "resets (a gradient-accumulation window) are not reported."
    ),
    example=(
        "running_loss = 0.0\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "    running_loss += loss"
    ),
    fix="running_loss += loss.item()",
    check=_accumulated_losses,
)


def _training_loop(ctx: FileContext, loop: ast.AST, optimizers: set[str]) -> bool:
    return any(
        is_backward(ctx, n) or is_optimizer_step(ctx, n, optimizers)
        for n in loop_calls(loop, direct=True)
    )


_EMPTY_CACHE = ("torch.cuda.empty_cache", "torch.mps.empty_cache", "torch.xpu.empty_cache")


def _empty_cache(ctx: FileContext) -> Iterator[Hit]:
    optimizers = optimizer_names(ctx)
    for node in ctx.nodes(ast.Call):
        if ctx.call_name(node) not in _EMPTY_CACHE:
            continue
        loop = ctx.enclosing_loop(node)
        if loop is None or not _training_loop(ctx, loop, optimizers):
            continue
        if in_periodic_if(ctx, node, loop) or in_except(ctx, node):
            continue
        yield Hit(node)


EMPTY_CACHE = Rule(
    code="TD103",
    name="empty-cache-in-training-loop",
    message="empty_cache() in the training loop frees no tensors and slows every step",
    what=(
        "torch.cuda.empty_cache() called on every iteration of a loop that runs backward() "
        "or optimizer.step(). Calls in an `except` block (recovering from an OOM) or "
        "every N steps are not reported."
    ),
    why=(
        "empty_cache() only returns cached, unused blocks to the driver; it frees no tensor "
        "and cures no leak. In the loop it forces the allocator to request the same memory "
        "from CUDA again on the next step, which synchronises and slows training. The one "
        "useful place is between phases with different memory profiles (training and "
        "evaluation)."
    ),
    example=(
        "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n"
        "    torch.cuda.empty_cache()"
    ),
    fix=(
        "for x, y in loader:\n"
        "    ...  # no empty_cache here; find what holds memory instead\n"
        "torch.cuda.empty_cache()  # at most between training and evaluation"
    ),
    check=_empty_cache,
)


def _eval_calls(ctx: FileContext) -> Iterator[Hit]:
    for scope in ctx.scopes():
        nodes = ctx.scope_nodes(scope)
        if any(is_backward(ctx, n) for n in nodes) or disables_grad_globally(ctx, nodes):
            continue
        switches: list[tuple[int, str, bool]] = []  # (line, target, eval?)
        for n in nodes:
            if isinstance(n, ast.Call) and method(n) in ("eval", "train") and not n.keywords:
                owner = receiver(n)
                if owner is None or not isinstance(owner, (ast.Name, ast.Attribute)):
                    continue
                evaluating = method(n) == "eval" or (
                    bool(n.args)
                    and isinstance(n.args[0], ast.Constant)
                    and n.args[0].value is False
                )
                if method(n) == "eval" and n.args:
                    continue
                switches.append((n.lineno, text(owner), evaluating))
        if not any(e for _l, _t, e in switches):
            continue
        reported: set[str] = set()
        for n in nodes:
            if not isinstance(n, ast.Call) or not isinstance(n.func, (ast.Name, ast.Attribute)):
                continue
            func = n.func
            called = text(func)
            if isinstance(func, ast.Attribute) and func.attr == "forward":
                called = text(func.value)
            before = [e for line, t, e in switches if t == called and line < n.lineno]
            if not before or not before[-1] or called in reported:
                continue
            if grad_disabled(ctx, n):
                continue
            reported.add(called)
            yield Hit(
                n,
                f"`{called}` runs in eval mode without torch.no_grad()/torch.inference_mode(): "
                "the forward records a graph and keeps activations for nothing",
            )


EVAL_WITHOUT_NO_GRAD = Rule(
    code="TD104",
    name="eval-without-no-grad",
    message="model called after .eval() but outside no_grad()/inference_mode(): it records a graph",
    what=(
        "A model called after `model.eval()` in a function (or script) that never calls "
        "backward(), outside `with torch.no_grad()` / `torch.inference_mode()` and not in a "
        "function decorated with them."
    ),
    why=(
        "model.eval() only changes layers such as dropout and batch norm; it does not stop "
        "autograd. Without no_grad every forward pass keeps its activations for a backward "
        "that never comes: evaluation uses several times the memory it needs (a common cause "
        "of an out-of-memory error at validation time) and runs slower."
    ),
    example=(
        "def evaluate(model, loader):\n"
        "    model.eval()\n"
        "    for x, y in loader:\n"
        "        out = model(x)"
    ),
    fix=(
        "@torch.inference_mode()\n"
        "def evaluate(model, loader):\n"
        "    model.eval()\n"
        "    for x, y in loader:\n"
        "        out = model(x)"
    ),
    check=_eval_calls,
)

RULES = (LOSS_KEPT, LOSS_ACCUMULATED, EMPTY_CACHE, EVAL_WITHOUT_NO_GRAD)
