"""TD2xx numerics: unstable formulations that turn into NaN or Inf."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.lint.context import FileContext, method, receiver, terminal, text
from torchdoctor.lint.rule import Hit, Rule
from torchdoctor.lint.rules._patterns import is_sigmoid, is_softmax


def _is_exp(ctx: FileContext, node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (
        ctx.call_name(node) == "torch.exp" or (method(node) == "exp" and not node.args)
    )


def _exp_arg(node: ast.Call) -> ast.AST | None:
    return node.args[0] if node.args else receiver(node)


_MAX_NAME = re.compile(r"(?i)(?:^|_)(?:a?max|logsumexp)$")  # x.max, torch.amax, _safe_amax


def _max_call(ctx: FileContext, node: ast.AST, scope: ast.AST | None) -> bool:
    """x.max(...), torch.amax(x), logsumexp, or a name assigned from one."""
    if isinstance(node, ast.Name) and scope is not None:
        return any(_max_call(ctx, v, None) for v in ctx.assigned(scope, node.id))
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and _MAX_NAME.search(terminal(n.func) or ""):
            return True
    return False


def _stabilised(ctx: FileContext, node: ast.AST | None, scope: ast.AST, depth: int = 0) -> bool:
    """exp(x - x.max(...)) and the like: the max subtracted first (also through names:
    z = x - x.max(...); exp(z), or m = x.amax(...); exp(x - m))."""
    if isinstance(node, ast.Name) and depth < 3:
        return any(_stabilised(ctx, v, scope, depth + 1) for v in ctx.assigned(scope, node.id))
    if not isinstance(node, ast.BinOp) or not isinstance(node.op, ast.Sub):
        return False
    return _max_call(ctx, node.right, scope)


def _sum_of(ctx: FileContext, node: ast.AST) -> ast.AST | None:
    """For x.sum(...) or torch.sum(x, ...), x."""
    if isinstance(node, ast.Call):
        if method(node) == "sum" and ctx.call_name(node) != "torch.sum":
            return receiver(node)
        if ctx.call_name(node) == "torch.sum" and node.args:
            return node.args[0]
    return None


def _exp_call(ctx: FileContext, scope: ast.AST, name: str) -> ast.Call | None:
    """The exp call a name is (only) assigned from in the scope."""
    values = ctx.assigned(scope, name)
    if values and all(_is_exp(ctx, v) for v in values):
        call = values[0]
        assert isinstance(call, ast.Call)
        return call
    return None


def _manual_softmax(ctx: FileContext) -> Iterator[Hit]:
    for scope in ctx.scopes():
        for n in ctx.scope_nodes(scope):
            if not isinstance(n, ast.BinOp) or not isinstance(n.op, ast.Div):
                continue
            summed = _sum_of(ctx, n.right)
            if summed is None:
                continue
            if _is_exp(ctx, n.left) and _is_exp(ctx, summed):
                assert isinstance(n.left, ast.Call) and isinstance(summed, ast.Call)
                a, b = _exp_arg(n.left), _exp_arg(summed)
                if (
                    a is not None
                    and b is not None
                    and text(a) == text(b)
                    and not _stabilised(ctx, a, scope)
                ):
                    yield Hit(n)
            elif (
                isinstance(n.left, ast.Name)
                and isinstance(summed, ast.Name)
                and summed.id == n.left.id
            ):
                call = _exp_call(ctx, scope, n.left.id)
                if call is not None and not _stabilised(ctx, _exp_arg(call), scope):
                    yield Hit(n)


MANUAL_SOFTMAX = Rule(
    code="TD201",
    name="manual-softmax",
    message="softmax written with exp(x) / exp(x).sum(): overflows; use torch.softmax",
    what=(
        "A softmax computed by hand as exp(x) divided by the sum of exp(x), without "
        "subtracting the maximum first."
    ),
    why=(
        "exp overflows to inf for inputs above about 88 in float32 (about 11 in float16), and "
        "inf / inf is NaN. torch.softmax subtracts the maximum internally, so it never "
        "overflows, and it is faster."
    ),
    example="probs = torch.exp(logits) / torch.exp(logits).sum(dim=-1, keepdim=True)",
    fix=(
        "probs = torch.softmax(logits, dim=-1)\n"
        "log_probs = torch.log_softmax(logits, dim=-1)  # when the log is what you need"
    ),
    check=_manual_softmax,
)


def _guarded(node: ast.AST) -> bool:
    """x + eps, x.clamp(...), torch.clamp(x, ...): a guard against log(0)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return True
    return isinstance(node, ast.Call) and (
        method(node) in ("clamp", "clamp_min", "clip", "add")
        or text(node.func).endswith(("clamp", "clip", "clamp_min", "maximum"))
    )


def _unwrap(node: ast.AST) -> ast.AST:
    """probs[idx] -> probs; probs.gather(...) -> probs."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and method(node) in (
            "gather",
            "squeeze",
            "view",
            "reshape",
        ):
            node = receiver(node)  # type: ignore[assignment]
        else:
            return node


def _probabilities(ctx: FileContext, scope: ast.AST, node: ast.AST) -> str | None:
    """'softmax' or 'sigmoid' when the node is one, or a name whose value where it is
    used (the last assignment before, in this scope) is one."""
    node = _unwrap(node)
    if is_softmax(ctx, node):
        return "softmax"
    if is_sigmoid(ctx, node):
        return "sigmoid"
    if isinstance(node, ast.Name):
        value = ctx.value_before(scope, node.id, getattr(node, "lineno", 0))
        if value is not None and value is not node:
            inner = _unwrap(value)
            if is_softmax(ctx, inner):
                return "softmax"
            if is_sigmoid(ctx, inner):
                return "sigmoid"
    return None


_LOG = ("torch.log", "torch.log2", "torch.log10")


def _log_of_probabilities(ctx: FileContext) -> Iterator[Hit]:
    for scope in ctx.scopes():
        for n in ctx.scope_nodes(scope):
            if not isinstance(n, ast.Call):
                continue
            if ctx.call_name(n) in _LOG and n.args:
                arg: ast.AST | None = n.args[0]
            elif method(n) == "log" and not n.args and ctx.call_name(n) not in ("math.log",):
                arg = receiver(n)
            else:
                continue
            if arg is None or _guarded(arg):
                continue
            kind = _probabilities(ctx, scope, arg)
            if kind == "softmax":
                yield Hit(
                    n,
                    "log of softmax output: use torch.log_softmax (or F.cross_entropy "
                    "on the logits)",
                )
            elif kind == "sigmoid":
                yield Hit(
                    n,
                    "log of sigmoid output: use F.logsigmoid (or BCEWithLogitsLoss on the logits)",
                )


LOG_OF_PROBABILITIES = Rule(
    code="TD202",
    name="log-of-probabilities",
    message="log of softmax/sigmoid output: use log_softmax, logsigmoid or a loss on logits",
    what=(
        "torch.log (or .log()) applied to the output of softmax or sigmoid, directly or "
        "through a variable, without an epsilon or clamp."
    ),
    why=(
        "Probabilities underflow to exactly 0 for confident predictions, and log(0) is -inf; "
        "its gradient is inf and the loss turns NaN. log_softmax and logsigmoid compute the "
        "same values in a stable way, and cross_entropy / BCEWithLogitsLoss take the logits "
        "directly."
    ),
    example=(
        "probs = F.softmax(logits, dim=-1)\n"
        "loss = -torch.log(probs[torch.arange(len(y)), y]).mean()"
    ),
    fix="loss = F.cross_entropy(logits, y)  # or F.log_softmax(logits, dim=-1) then nll_loss",
    check=_log_of_probabilities,
)

_LOGIT_LOSSES = {
    "torch.nn.CrossEntropyLoss": "softmax",
    "torch.nn.NLLLoss": "softmax",
    "torch.nn.BCEWithLogitsLoss": "sigmoid",
    "torch.nn.functional.cross_entropy": "softmax",
    "torch.nn.functional.nll_loss": "softmax",
    "torch.nn.functional.binary_cross_entropy_with_logits": "sigmoid",
}


def _criteria(ctx: FileContext) -> dict[str, str]:
    """Names (or attribute names) bound to loss modules that want logits."""
    out: dict[str, str] = {}
    for n in ctx.nodes(ast.Assign):
        assert isinstance(n, ast.Assign)
        if isinstance(n.value, ast.Call):
            name = ctx.call_name(n.value)
            if name in _LOGIT_LOSSES and name.rsplit(".", 1)[-1][0].isupper():
                for t in n.targets:
                    out[text(t)] = name
    return out


def _softmax_module(ctx: FileContext, node: ast.AST) -> bool:
    """nn.Softmax(...) or nn.Sequential(..., nn.Softmax(...))."""
    if not isinstance(node, ast.Call):
        return False
    name = ctx.call_name(node)
    if name == "torch.nn.Softmax":
        return True
    if name == "torch.nn.Sequential" and node.args:
        return _softmax_module(ctx, node.args[-1])
    return False


def _self_attributes(cls: ast.ClassDef) -> dict[str, ast.expr]:
    """`self.x = value` in the class's methods."""
    out: dict[str, ast.expr] = {}
    for n in ast.walk(cls):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Attribute) and text(t.value) == "self":
                    out[t.attr] = n.value
    return out


def _ends_in_softmax(ctx: FileContext, cls: ast.ClassDef) -> ast.AST | None:
    """The return of `forward` when every return gives softmax output (F.softmax(x),
    self.softmax(x) with self.softmax = nn.Softmax(), self.net(x) with an nn.Sequential
    that ends in one)."""
    forward = next(
        (
            m
            for m in cls.body
            if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name == "forward"
        ),
        None,
    )
    if forward is None:
        return None
    attributes = _self_attributes(cls)
    returns = [n for n in ctx.scope_nodes(forward) if isinstance(n, ast.Return)]
    if not returns:
        return None
    for r in returns:
        value = r.value
        if isinstance(value, ast.Name):
            value = ctx.value_before(forward, value.id, r.lineno)
        if value is None:
            return None
        if is_softmax(ctx, value):
            continue
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and text(value.func.value) == "self"
            and _softmax_module(ctx, attributes.get(value.func.attr, value))
        ):
            continue
        return None
    return returns[-1]


def _softmax_models(ctx: FileContext) -> dict[str, ast.AST]:
    """Names bound to models of this file whose output is softmax probabilities -> where
    the softmax is."""
    classes = {}
    for c in ctx.nodes(ast.ClassDef):
        assert isinstance(c, ast.ClassDef)
        last = _ends_in_softmax(ctx, c)
        if last is not None:
            classes[c.name] = last
    out: dict[str, ast.AST] = {}
    for n in ctx.nodes(ast.Assign):
        assert isinstance(n, ast.Assign)
        value = n.value
        while isinstance(value, ast.Call) and method(value) in ("to", "cuda", "cpu", "float"):
            value = receiver(value)  # type: ignore[assignment]
        if not isinstance(value, ast.Call):
            continue
        where: ast.AST | None = None
        if terminal(value.func) in classes and isinstance(value.func, ast.Name):
            where = classes[value.func.id]
        elif _softmax_module(ctx, value):
            where = value
        if where is not None:
            for t in n.targets:
                out[text(t)] = where
    return out


def _model_output(
    ctx: FileContext, scope: ast.AST, node: ast.AST, models: dict[str, ast.AST]
) -> ast.AST | None:
    """Where the softmax is, when the node is (a name holding) the output of such a model."""
    if isinstance(node, ast.Name):
        node = ctx.value_before(scope, node.id, getattr(node, "lineno", 0)) or node
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
        return models.get(text(node.func))
    return None


def _softmax_into_loss(ctx: FileContext) -> Iterator[Hit]:
    criteria = _criteria(ctx)
    models = _softmax_models(ctx)
    for scope in ctx.scopes():
        for n in ctx.scope_nodes(scope):
            if not isinstance(n, ast.Call) or not n.args:
                continue
            loss = ctx.call_name(n)
            if loss not in _LOGIT_LOSSES or loss.rsplit(".", 1)[-1][0].isupper():
                loss = criteria.get(text(n.func))
            if loss is None:
                continue
            wanted = _LOGIT_LOSSES[loss]
            short = loss.rsplit(".", 1)[-1]
            fix = "pass the logits" if wanted == "softmax" else "pass the logits, no sigmoid"
            if short in ("NLLLoss", "nll_loss"):
                fix = "use log_softmax"
            if _probabilities(ctx, scope, n.args[0]) == wanted:
                yield Hit(
                    n,
                    f"{short} applies its own (log-)softmax/sigmoid to its input; "
                    f"feeding it {wanted} output is wrong: {fix}",
                )
                continue
            where = _model_output(ctx, scope, n.args[0], models) if wanted == "softmax" else None
            if where is not None:
                yield Hit(
                    n,
                    f"the model's output is already softmax (line {getattr(where, 'lineno', '?')})"
                    f"; {short} applies log_softmax to its input again: end the model on "
                    "the logits (softmax only for predictions)",
                )


SOFTMAX_INTO_LOSS = Rule(
    code="TD203",
    name="softmax-into-cross-entropy",
    message="probabilities fed to a loss that expects logits",
    what=(
        "The output of softmax fed to CrossEntropyLoss / F.cross_entropy or NLLLoss, or the "
        "output of sigmoid fed to BCEWithLogitsLoss; also the output of a model of the same "
        "file whose forward ends in softmax (or an nn.Sequential whose last layer is "
        "nn.Softmax) fed to CrossEntropyLoss or NLLLoss."
    ),
    why=(
        "CrossEntropyLoss applies log_softmax itself and BCEWithLogitsLoss applies the "
        "sigmoid itself; a second softmax squashes the logits into [0, 1], gradients vanish "
        "and the model learns slowly or not at all. NLLLoss wants log-probabilities, not "
        "probabilities."
    ),
    example=("criterion = nn.CrossEntropyLoss()\nloss = criterion(F.softmax(model(x), dim=1), y)"),
    fix="criterion = nn.CrossEntropyLoss()\nloss = criterion(model(x), y)  # raw logits",
    check=_softmax_into_loss,
)

_NORMS = {"torch.norm", "torch.linalg.norm", "torch.linalg.vector_norm", "torch.sum"}


def _own_denominator(ctx: FileContext, left: ast.AST, right: ast.AST) -> str | None:
    """'sum' or 'norm' when `right` is the sum or norm of `left` itself."""
    if not isinstance(left, (ast.Name, ast.Attribute, ast.Subscript)) or not isinstance(
        right, ast.Call
    ):
        return None
    name = ctx.call_name(right)
    if name in _NORMS and right.args:
        of = right.args[0]
        kind = "sum" if name == "torch.sum" else "norm"
    elif method(right) in ("sum", "norm"):
        of = receiver(right)  # type: ignore[assignment]
        kind = method(right)  # type: ignore[assignment]
    else:
        return None
    return kind if of is not None and text(of) == text(left) else None


_ZEROING_CALLS = {"relu", "relu_", "masked_fill", "masked_fill_"}


def _zeroing(ctx: FileContext, value: ast.AST) -> bool:
    """An expression that can leave whole rows at exactly 0: a mask product, relu,
    masked_fill, clamp(min=0), a comparison turned into numbers."""
    for n in ast.walk(value):
        if (
            isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Mult)
            and any("mask" in text(side).lower() for side in (n.left, n.right))
        ):
            return True
        if not isinstance(n, ast.Call):
            continue
        last = terminal(n.func) or ""
        if last in _ZEROING_CALLS:
            return True
        if last in ("clamp", "clamp_", "clamp_min", "clip") and any(
            isinstance(a, ast.Constant) and a.value == 0
            for a in [*n.args, *(k.value for k in n.keywords)]
        ):
            return True
        if last in ("float", "int", "long", "half", "to", "type") and isinstance(
            receiver(n), ast.Compare
        ):
            return True
    return False


def _may_be_zero(ctx: FileContext, scope: ast.AST, left: ast.AST, line: int) -> bool:
    """Evidence in the scope, before `line`, that the divided tensor can be all zeros."""
    name = text(left)
    if "mask" in name.lower():
        return True
    for n in ctx.scope_nodes(scope):
        if getattr(n, "lineno", line) >= line:
            continue
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if text(t) == name and _zeroing(ctx, n.value):
                    return True
                if (
                    isinstance(t, ast.Subscript)
                    and text(t.value) == name
                    and isinstance(n.value, ast.Constant)
                    and n.value.value == 0
                ):
                    return True  # x[x < threshold] = 0
        elif (
            isinstance(n, ast.AugAssign)
            and text(n.target) == name
            and isinstance(n.op, ast.Mult)
            and "mask" in text(n.value).lower()
        ):
            return True
    return False


def _guarded_by_check(ctx: FileContext, node: ast.AST, left: ast.AST, scope: ast.AST) -> bool:
    """A zero check around (or before) the division: `if x.sum() > 0:` with the division
    in either branch, torch.where(x.sum() > 0, ...), or an earlier
    `if not x.any(): return`."""
    name = text(left)

    def mentions(test: ast.AST) -> bool:
        return any(text(n) == name for n in ast.walk(test))

    for a in ctx.ancestors(node):
        if a is scope:
            break
        if isinstance(a, (ast.If, ast.IfExp, ast.While)) and mentions(a.test):
            return True
        if (
            isinstance(a, ast.Call)
            and terminal(a.func) in ("where", "nan_to_num")
            and (not a.args or mentions(a.args[0]) or terminal(a.func) == "nan_to_num")
        ):
            return True
    line = getattr(node, "lineno", 0)
    for n in ctx.scope_nodes(scope):
        if (
            isinstance(n, ast.If)
            and n.lineno < line
            and mentions(n.test)
            and n.body
            and (
                isinstance(n.body[-1], (ast.Return, ast.Continue, ast.Raise, ast.Break))
                or any(  # `if x.sum() <= 0: x = fallback`: the zero case repaired
                    isinstance(b, ast.Assign) and name in {text(t) for t in b.targets}
                    for b in n.body
                )
            )
        ):
            return True
    return False


def _divide_without_eps(ctx: FileContext) -> Iterator[Hit]:
    for n in ctx.nodes((ast.BinOp, ast.AugAssign)):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            left, kind = n.left, _own_denominator(ctx, n.left, n.right)
        elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div):
            left, kind = n.target, _own_denominator(ctx, n.target, n.value)
        else:
            continue
        if not kind:
            continue
        scope = ctx.scope(n)
        if not _may_be_zero(ctx, scope, left, n.lineno) or _guarded_by_check(ctx, n, left, scope):
            continue
        yield Hit(
            n,
            f"division by its own {kind} without an epsilon, and `{text(left)}` can be all "
            f"zeros here: NaN when the {kind} is 0; add an epsilon or clamp the denominator "
            "(or F.normalize)",
        )


DIVIDE_WITHOUT_EPS = Rule(
    code="TD204",
    name="divide-by-sum-without-eps",
    message="division by a sum or norm without an epsilon: NaN when it is 0",
    what=(
        "A tensor divided by its own sum or norm (x / x.sum(...), x / x.norm(...), "
        "x / torch.linalg.norm(x, ...)) with nothing that keeps the denominator away from "
        "0, where the same code shows that the tensor can be all zeros: a mask, a product "
        "with a mask, relu, masked_fill, clamp(min=0), elements set to 0. Divisions under "
        "a zero check (either branch of `if x.sum() > 0`, torch.where, an early return) "
        "are not reported; nor are values with no sign of zeros (softmax output, counts)."
    ),
    why=(
        "An all-zero row (a padded position, an empty mask, a dead feature) gives 0 / 0 = NaN "
        "in the forward pass, and the norm's gradient at 0 is infinite. One such row poisons "
        "the loss and then every weight."
    ),
    example=(
        "scores = scores.masked_fill(~mask, 0.0)\n"
        "weights = scores / scores.sum(dim=-1, keepdim=True)"
    ),
    fix=(
        "scores = scores.masked_fill(~mask, 0.0)\n"
        "weights = scores / (scores.sum(dim=-1, keepdim=True) + 1e-8)\n"
        "unit = F.normalize(x, dim=-1)  # for norms: clamps the denominator for you"
    ),
    check=_divide_without_eps,
)

RULES = (MANUAL_SOFTMAX, LOG_OF_PROBABILITIES, SOFTMAX_INTO_LOSS, DIVIDE_WITHOUT_EPS)
