"""TD1xx memory: graphs kept alive across steps, cache flushing in the loop, evaluation that
records a graph."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.lint.context import (
    FileContext,
    method,
    names_in,
    receiver,
    terminal,
    text,
)
from torchdoctor.lint.rule import Hit, Rule
from torchdoctor.lint.rules._patterns import (
    backward_operands,
    disables_grad_globally,
    grad_disabled,
    in_except,
    in_periodic_if,
    is_backward,
    is_optimizer_step,
    mode_switches,
    optimizer_names,
)

_LOSS_CALL = re.compile(r"(?i)loss|criterion|cross_entropy|nll|mse|bce")
# Loss functions of other libraries that return plain numbers (sklearn's log_loss).
_NOT_TENSOR_LIBS = ("sklearn.", "numpy.", "scipy.", "math.", "statistics.")
_DETACHING = {"item", "detach", "tolist", "numpy", "cpu"}
_EVAL_FUNCTION = re.compile(r"(?i)eval|valid|test|predict|infer")


def _loss_call(ctx: FileContext, value: ast.AST) -> bool:
    if not isinstance(value, ast.Call) or not _LOSS_CALL.search(terminal(value.func) or ""):
        return False
    name = ctx.call_name(value) or ""
    return not name.startswith(_NOT_TENSOR_LIBS)


def _torch_loss_call(ctx: FileContext, value: ast.AST) -> bool:
    """F.cross_entropy(...) and the like: a call that certainly returns a tensor."""
    name = ctx.call_name(value) or ""
    return name.startswith("torch.") and bool(_LOSS_CALL.search(name.rsplit(".", 1)[-1]))


def _loss_names(ctx: FileContext, loop: ast.AST, without_backward: bool = False) -> set[str]:
    """Names in a training loop (one that calls backward()) that hold a loss with its
    graph: differentiated in the loop, or (outside grad-free code) computed by a loss
    function or criterion. In a loop without backward() a name counts only with
    `without_backward`, and only when a torch loss function computed it: another
    library's loss (sklearn's log_loss) returns a number."""
    nodes = ctx.loop_nodes(loop)
    backwards = [n for n in nodes if is_backward(ctx, n)]
    if not backwards:
        if not without_backward or _EVAL_FUNCTION.search(getattr(ctx.scope(loop), "name", "")):
            return set()
        return {
            t.id
            for n in nodes
            if isinstance(n, ast.Assign)
            and _torch_loss_call(ctx, n.value)
            and not grad_disabled(ctx, n)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
    names: set[str] = set()
    for n in backwards:
        assert isinstance(n, ast.Call)
        names |= backward_operands(ctx, n)
    scope = ctx.scope(loop)
    function_name = getattr(scope, "name", "")
    for n in nodes:
        if (
            isinstance(n, ast.Assign)
            and _loss_call(ctx, n.value)
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


def _reset_in(ctx: FileContext, loop: ast.AST, target: str, but: ast.AST | None = None) -> bool:
    """The loop itself rebinds or clears the collection (`total = 0`, `losses = []`,
    `losses.clear()` after logging): what it keeps is bounded by the steps in between."""
    for n in ctx.loop_nodes(loop, direct=True):
        if n is but:
            continue
        if (
            isinstance(n, ast.Assign)
            and any(text(t) == target for t in n.targets)
            and target not in {text(x) for x in ast.walk(n.value)}  # not total = total + x
        ):
            return True
        if isinstance(n, ast.Call) and method(n) == "clear" and text(receiver(n) or n) == target:
            return True
    return False


def _kept_losses(ctx: FileContext) -> Iterator[Hit]:
    for loop in ctx.loops():
        losses = _loss_names(ctx, loop, without_backward=True)
        if not losses:
            continue
        used_in_backward = _differentiated_names(ctx, ctx.scope(loop))
        for n in ctx.loop_nodes(loop, direct=True):
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
                if name and owner not in used_in_backward and not _reset_in(ctx, loop, collection):
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


def _running_total(n: ast.AST) -> tuple[ast.expr, ast.expr] | None:
    """(total, added) for `total += x`, `total -= x` and `total = total + x`."""
    if isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Add, ast.Sub)):
        return n.target, n.value
    if (
        isinstance(n, ast.Assign)
        and len(n.targets) == 1
        and isinstance(n.value, ast.BinOp)
        and isinstance(n.value.op, (ast.Add, ast.Sub))
    ):
        target, left, right = text(n.targets[0]), n.value.left, n.value.right
        if text(left) == target:
            return n.targets[0], right
        if text(right) == target and isinstance(n.value.op, ast.Add):
            return n.targets[0], left
    return None


def _accumulated_losses(ctx: FileContext) -> Iterator[Hit]:
    for loop in ctx.loops():
        losses = _loss_names(ctx, loop)
        if not losses:
            continue
        differentiated = _differentiated_names(ctx, ctx.scope(loop))
        for n in ctx.loop_nodes(loop, direct=True):
            total = _running_total(n)
            if total is None:
                continue
            target_node, added = total
            target = terminal(target_node)
            name = _graph_ref(added, losses)
            if (
                name
                and target
                and target not in losses
                and target not in differentiated
                and not grad_disabled(ctx, n)
                and not _reset_in(ctx, loop, text(target_node), but=n)
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
        "A running total updated with the loss tensor in a training loop (one that calls "
        "backward()): `running_loss += loss`, `total = total + loss`, `+= loss * "
        "x.size(0)`. Loops without backward() (a loss function summing its terms, "
        "evaluation) are not reported."
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
        for n in ctx.loop_nodes(loop, direct=True)
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


def _called_module(n: ast.Call) -> str | None:
    func = n.func
    if not isinstance(func, (ast.Name, ast.Attribute)):
        return None
    if isinstance(func, ast.Attribute) and func.attr == "forward":
        return text(func.value)
    return text(func)


def _eval_calls(ctx: FileContext) -> Iterator[Hit]:
    for scope in ctx.scopes():
        nodes = ctx.scope_nodes(scope)
        if disables_grad_globally(ctx, nodes):
            continue
        switches = mode_switches(nodes)
        if not any(e for _l, _t, e in switches):
            continue
        backwards = [n.lineno for n in nodes if is_backward(ctx, n)]  # type: ignore[attr-defined]
        reported: set[tuple[str, int]] = set()  # once per module and eval() call
        for n in nodes:
            if not isinstance(n, ast.Call):
                continue
            called = _called_module(n)
            if called is None:
                continue
            before = [(line, e) for line, t, e in switches if t == called and line < n.lineno]
            if not before or not before[-1][1] or (called, before[-1][0]) in reported:
                continue
            # A backward() later on with no train() in between: the eval-mode output is
            # being trained through (frozen batch norm), the graph is wanted.
            trains = [line for line, t, e in switches if t == called and not e]
            if any(b >= n.lineno and not any(n.lineno < t < b for t in trains) for b in backwards):
                continue
            if grad_disabled(ctx, n, callers=3):
                continue
            reported.add((called, before[-1][0]))
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
        "A model called after `model.eval()` (in a function, or at script level), outside "
        "`with torch.no_grad()` / `torch.inference_mode()`, not in a function decorated "
        "with them (or with a wrapper named after them), and not in a function whose every "
        "caller in the file runs with autograd off. A call whose output a later backward() "
        "may use (no train() in between) is not reported."
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
