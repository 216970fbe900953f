"""Recognisers shared by the rules: backward passes, optimizer steps, grad-free regions,
softmax calls, rank conditions."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from torchdoctor.lint.context import (
    FUNCTIONS,
    GRAD_OFF,
    FileContext,
    is_const,
    keyword,
    method,
    receiver,
    terminal,
    text,
)

_OPTIMIZER_NAME = re.compile(
    r"(?i)(?:^|_)(?:opt|optim|optimizer|optimiser|optimizers)(?:\d+|_\w+)?$"
)
_NOT_OPTIMIZER = re.compile(r"(?i)sched|lr")
_OPTIMIZER_CLASS = re.compile(
    r"(?:Optimizer|Adam\w*|SGD|RMSprop|Adagrad|Adadelta|Adamax|LBFGS|Lion|Lamb|Sophia\w*|Muon|Adafactor|NAdam|RAdam|ASGD|Rprop|ZeroRedundancyOptimizer)$"
)
_ZERO_GRAD = re.compile(r"(?i)zero_grads?$|clear_grads?$|reset_grads?$")


def is_backward(ctx: FileContext, node: ast.AST) -> bool:
    """loss.backward(), scaler.scale(loss).backward(), accelerator.backward(loss),
    torch.autograd.backward(...)."""
    if not isinstance(node, ast.Call):
        return False
    return method(node) == "backward" or ctx.call_name(node) == "torch.autograd.backward"


def backward_operands(ctx: FileContext, node: ast.Call) -> set[str]:
    """The names the differentiated expression is built from."""
    target: ast.AST | None
    if ctx.call_name(node) == "torch.autograd.backward" or (
        method(node) == "backward" and node.args and not _is_tensor_expr(receiver(node))
    ):
        target = node.args[0] if node.args else None
    else:
        target = receiver(node)
        if isinstance(target, ast.Call) and method(target) == "scale" and target.args:
            target = target.args[0]
    if target is None:
        return set()
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _is_tensor_expr(node: ast.AST | None) -> bool:
    # accelerator.backward(loss): a receiver that is a plain helper object, not the tensor.
    name = terminal(node)
    return not (name and re.search(r"(?i)accelerator|engine|fabric|trainer", name))


def optimizer_names(ctx: FileContext) -> set[str]:
    """Names (or attribute names) assigned an optimizer in this file."""
    return ctx.memo("optimizer_names", lambda: _optimizer_names(ctx))


def _optimizer_names(ctx: FileContext) -> set[str]:
    out: set[str] = set()
    for node in ctx.nodes(ast.Assign):
        assert isinstance(node, ast.Assign)
        if not isinstance(node.value, ast.Call):
            continue
        name = ctx.call_name(node.value) or ""
        last = name.rsplit(".", 1)[-1]
        if (
            name.startswith("torch.optim.") and ".lr_scheduler" not in name
        ) or _OPTIMIZER_CLASS.search(last):
            for target in node.targets:
                t = terminal(target)
                if t:
                    out.add(t)
    return out


def is_optimizer_step(ctx: FileContext, node: ast.AST, known: set[str]) -> bool:
    """optimizer.step(), opt_g.step(), self.optimizer.step(), scaler.step(optimizer),
    xm.optimizer_step(optimizer)."""
    if not isinstance(node, ast.Call):
        return False
    name = method(node)
    if name == "optimizer_step":
        return True
    if name != "step":
        return False
    owner = terminal(receiver(node))
    if owner is None or _NOT_OPTIMIZER.search(owner):
        return False
    if owner in known or _OPTIMIZER_NAME.search(owner):
        return True
    return "scaler" in owner.lower() and bool(node.args)


def is_zero_grad(node: ast.AST) -> bool:
    """optimizer.zero_grad(), model.zero_grad(), p.grad = None, p.grad.zero_()."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else terminal(func)
        if name and _ZERO_GRAD.search(name):
            return True
        if method(node) in ("zero_", "detach_", "requires_grad_") and terminal(receiver(node)) in (
            "grad",
            "data",
        ):
            return True
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Attribute) and t.attr == "grad" for t in node.targets)
    return False


def grad_off_item(ctx: FileContext, expr: ast.AST) -> bool:
    """A `with` item or decorator that turns autograd off: torch.no_grad(),
    torch.inference_mode(), set_grad_enabled(False), and project wrappers named after
    them (yolov5's @smart_inference_mode())."""
    target = expr.func if isinstance(expr, ast.Call) else expr
    name = ctx.qualname(target)
    if name in GRAD_OFF:
        if isinstance(expr, ast.Call) and name.endswith("inference_mode") and expr.args:
            return not is_const(expr.args[0], False)
        return True
    if name in ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled"):
        return isinstance(expr, ast.Call) and bool(expr.args) and is_const(expr.args[0], False)
    last = (name or terminal(target) or "").rsplit(".", 1)[-1]
    return bool(_GRAD_OFF_WRAPPER.search(last))


_GRAD_OFF_WRAPPER = re.compile(r"(?i)(?:inference_mode|no_grad)$")


def decorated_grad_off(ctx: FileContext, func: ast.AST) -> bool:
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    return any(grad_off_item(ctx, d) for d in func.decorator_list)


def grad_disabled(ctx: FileContext, node: ast.AST, callers: int = 0) -> bool:
    """Whether autograd is off where `node` runs: inside `with torch.no_grad()` (or
    inference_mode, set_grad_enabled(False)), in a function decorated with them, or (with
    `callers` > 0) in a function of this file whose every call here runs with autograd
    off, looked up through that many levels of callers."""
    for a in ctx.ancestors(node):
        if isinstance(a, (ast.With, ast.AsyncWith)) and any(
            grad_off_item(ctx, item.context_expr) for item in a.items
        ):
            return True
        if isinstance(a, FUNCTIONS):
            if decorated_grad_off(ctx, a):
                return True
            if callers > 0 and isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef)):
                sites = [c for c in ctx.calls_to(a.name) if a not in _enclosing(ctx, c)]
                if sites and all(grad_disabled(ctx, c, callers - 1) for c in sites):
                    return True
    return False


def _enclosing(ctx: FileContext, node: ast.AST) -> list[ast.AST]:
    return [a for a in ctx.ancestors(node) if isinstance(a, FUNCTIONS)]


def disables_grad_globally(ctx: FileContext, scope_nodes: Iterable[ast.AST]) -> bool:
    """torch.set_grad_enabled(False) called as a statement in the scope."""
    for n in scope_nodes:
        if (
            isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and grad_off_item(ctx, n.value)
        ):
            return True
    return False


_SOFTMAX = {
    "torch.softmax",
    "torch.nn.functional.softmax",
    "torch.special.softmax",
}
_SIGMOID = {"torch.sigmoid", "torch.nn.functional.sigmoid", "torch.special.expit"}


def is_softmax(ctx: FileContext, node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        ctx.call_name(node) in _SOFTMAX
        or (method(node) == "softmax" and not _module_call(ctx, node))
    )


def is_sigmoid(ctx: FileContext, node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        ctx.call_name(node) in _SIGMOID
        or (method(node) == "sigmoid" and not _module_call(ctx, node))
    )


def _module_call(ctx: FileContext, node: ast.Call) -> bool:
    """F.softmax resolved already; `torch.nn.functional.softmax` seen as method of a module."""
    owner = ctx.qualname(receiver(node))
    return owner is not None and owner.startswith("torch")


_RANK_NAME = re.compile(
    r"(?i)(?:^|_)(?:rank|local_rank|global_rank|node_rank|process_index|local_process_index)$"
    r"|is_main|is_master|main_process|master_process|rank_zero|is_global_zero|"
    r"is_world_process_zero|is_local_main|is_rank0|is_chief"
)


def _distributed_check(test: ast.AST) -> bool:
    """`local_rank != -1` and the like: "is this run distributed", the same on every rank."""
    return (
        isinstance(test, ast.Compare)
        and all(isinstance(op, (ast.Eq, ast.NotEq)) for op in test.ops)
        and all(
            isinstance(c, ast.UnaryOp) and isinstance(c.op, ast.USub) and is_const(c.operand, 1)
            for c in test.comparators
        )
    )


def is_rank_condition(ctx: FileContext, test: ast.AST) -> bool:
    """A condition that some ranks pass and others do not (rank == 0, is_main_process)."""
    if _distributed_check(test):
        return False
    for n in ast.walk(test):
        name = None
        if isinstance(n, (ast.Name, ast.Attribute)):
            name = terminal(n)
        elif isinstance(n, ast.Call):
            name = terminal(n.func)
        elif isinstance(n, ast.Constant) and n.value in ("RANK", "LOCAL_RANK"):
            return True
        if name and (_RANK_NAME.search(name) or name in ("get_rank", "get_local_rank")):
            return True
    return False


def in_periodic_if(ctx: FileContext, node: ast.AST, stop: ast.AST) -> bool:
    """Inside an `if` whose test uses % (every N steps), below `stop`."""
    for a in ctx.ancestors(node):
        if a is stop:
            return False
        if isinstance(a, ast.If) and any(
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(a.test)
        ):
            return True
    return False


def in_if(ctx: FileContext, node: ast.AST, stop: ast.AST | None = None) -> ast.If | None:
    """The nearest `if` around the node (not counting `if __name__ == "__main__"`)."""
    for a in ctx.ancestors(node):
        if a is stop or isinstance(a, FUNCTIONS):
            return None
        if isinstance(a, ast.If) and not _is_main_guard(a.test):
            return a
    return None


def _is_main_guard(test: ast.AST) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
    )


def in_except(ctx: FileContext, node: ast.AST) -> bool:
    return any(isinstance(a, ast.ExceptHandler) for a in ctx.ancestors(node))


def keyword_true(call: ast.Call, name: str) -> bool:
    value = keyword(call, name)
    return value is not None and not is_const(value, False) and not is_const(value, None)


def mode_switches(nodes: list[ast.AST]) -> list[tuple[int, str, bool]]:
    """(line, module, eval?) for every `m.eval()` / `m.train()` / `m.train(False)`."""
    switches: list[tuple[int, str, bool]] = []
    for n in nodes:
        if not isinstance(n, ast.Call) or method(n) not in ("eval", "train") or n.keywords:
            continue
        owner = receiver(n)
        if owner is None or not isinstance(owner, (ast.Name, ast.Attribute)):
            continue
        if method(n) == "eval" and n.args:
            continue
        evaluating = method(n) == "eval" or (bool(n.args) and is_const(n.args[0], False))
        switches.append((n.lineno, text(owner), evaluating))
    return switches


def exclusive(ctx: FileContext, a: ast.AST, b: ast.AST) -> bool:
    """Whether a and b sit in different branches of one `if` (or try/except): they never
    run in the same pass."""
    chain_a = {id(x): x for x in ctx.ancestors(a)}
    child_b = b
    for anc in ctx.ancestors(b):
        if id(anc) in chain_a and isinstance(anc, (ast.If, ast.Try)):
            branch_b = _branch(anc, child_b)
            child_a = next(x for x in [a, *ctx.ancestors(a)] if ctx.parent(x) is anc)
            branch_a = _branch(anc, child_a)
            return branch_a is not None and branch_b is not None and branch_a != branch_b
        if id(anc) in chain_a:
            return False
        child_b = anc
    return False


def _branch(node: ast.If | ast.Try, child: ast.AST) -> str | None:
    if isinstance(node, ast.If):
        if child in node.body:
            return "body"
        if child in node.orelse:
            return "orelse"
        return None
    if child in node.body or child in node.orelse:
        return "body"
    if child in node.handlers:
        return f"handler{node.handlers.index(child)}"
    return None
