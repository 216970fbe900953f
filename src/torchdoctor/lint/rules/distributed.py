"""TD5xx distributed: collectives some ranks never reach, samplers that pad or never
reshuffle."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.lint.context import (
    FUNCTIONS,
    FileContext,
    has_star_kwargs,
    is_const,
    keyword,
    method,
    receiver,
    terminal,
    text,
)
from torchdoctor.lint.rule import Hit, Rule
from torchdoctor.lint.rules._patterns import is_backward, is_rank_condition

COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "barrier",
    "monitored_barrier",
}
_RANK_ONLY_DECORATOR = re.compile(r"(?i)rank_zero_only|main_process_only|rank0_only")


def _collective(ctx: FileContext, node: ast.AST) -> str | None:
    name = ctx.call_name(node)
    if name and name.startswith("torch.distributed."):
        last = name.rsplit(".", 1)[-1]
        if last in COLLECTIVES:
            return last
    return None


def _calls(ctx: FileContext, nodes: list[ast.stmt], name: str) -> bool:
    return any(_collective(ctx, n) == name for s in nodes for n in ast.walk(s))


def _rank_guard(
    ctx: FileContext, node: ast.AST, name: str
) -> ast.If | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | None:
    """The rank condition (or rank-zero-only decorator) that only some ranks pass."""
    child = node
    for a in ctx.ancestors(node):
        if isinstance(a, ast.If) and is_rank_condition(ctx, a.test):
            other = a.orelse if child in a.body else a.body
            if not _calls(ctx, other, name):
                return a
        if isinstance(a, FUNCTIONS):
            decorators = getattr(a, "decorator_list", [])
            if any(_RANK_ONLY_DECORATOR.search(text(d)) for d in decorators):
                return a
            return None
        child = a
    return None


def _collective_under_rank(ctx: FileContext) -> Iterator[Hit]:
    found: dict[tuple[int, str], list[tuple[ast.AST, ast.AST | None]]] = {}
    for n in ctx.nodes(ast.Call):
        name = _collective(ctx, n)
        if name is not None:
            key = (id(ctx.scope(n)), name)
            found.setdefault(key, []).append((n, _rank_guard(ctx, n, name)))
    for (_scope, name), calls in found.items():
        guards = {id(g) for _n, g in calls if g is not None}
        if len(guards) > 1 and all(g is not None for _n, g in calls):
            # Paired guards (`if rank != 0: barrier()` ... `if rank == 0: barrier()`):
            # every rank reaches one of them.
            continue
        for n, guard in calls:
            if guard is not None:
                yield Hit(
                    n,
                    f"dist.{name}() runs only on the ranks that pass "
                    f"line {getattr(guard, 'lineno', '?')}'s rank condition: the other ranks "
                    "never join it and the job hangs until the NCCL timeout",
                )


COLLECTIVE_UNDER_RANK = Rule(
    code="TD501",
    name="collective-under-rank-condition",
    message="a collective called only by some ranks: the others never join and the job hangs",
    what=(
        "A torch.distributed collective (all_reduce, broadcast, all_gather, barrier, ...) "
        "inside `if rank == 0:` (or is_main_process, get_rank() checks, a rank_zero_only "
        "function) without the same collective in the other branch."
    ),
    why=(
        "Every rank must enter every collective, in the same order. When only rank 0 calls "
        "all_reduce, rank 0 waits for peers that never come (and they wait for rank 0 at "
        "their next collective): the job hangs until the watchdog's timeout kills it."
    ),
    example=(
        "if dist.get_rank() == 0:\n"
        "    dist.all_reduce(val_loss)\n"
        "    print(val_loss.item() / world_size)"
    ),
    fix=(
        "dist.all_reduce(val_loss)  # every rank\n"
        "if dist.get_rank() == 0:\n"
        "    print(val_loss.item() / world_size)"
    ),
    check=_collective_under_rank,
)

_SAMPLER = re.compile(r"(?:^|\.)DistributedSampler$")
_LOADER = re.compile(r"(?:^|\.)DataLoader$")
_BATCH_SAMPLER = re.compile(r"(?:^|\.)BatchSampler$")


def _samplers(ctx: FileContext) -> list[ast.Call]:
    return [
        n
        for n in ctx.nodes(ast.Call)
        if isinstance(n, ast.Call) and _SAMPLER.search(ctx.call_name(n) or "")
    ]


def _bound_names(ctx: FileContext, call: ast.Call) -> set[str]:
    parent = ctx.parent(call)
    if isinstance(parent, ast.Assign):
        return {text(t) for t in parent.targets}
    if isinstance(parent, ast.NamedExpr):
        return {text(parent.target)}
    return set()


def _uses(value: ast.AST | None, call: ast.Call, names: set[str]) -> bool:
    if value is None:
        return False
    return value is call or text(value) in names or any(n is call for n in ast.walk(value))


def _dict_keys(
    ctx: FileContext, scope: ast.AST, name: str, line: int, depth: int = 0
) -> dict[str, ast.expr] | None:
    """The keys and values of a keyword dict built in the scope (`kw = {...}` and then
    `kw.update({...})` or `kw.update(other)`); None when some of it cannot be seen."""
    value = ctx.value_before(scope, name, line)
    if not isinstance(value, ast.Dict) or depth > 2:
        return None
    out: dict[str, ast.expr] = {}
    for k, v in zip(value.keys, value.values, strict=True):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            return None
        out[k.value] = v
    for n in ctx.scope_nodes(scope):
        if not (
            isinstance(n, ast.Call)
            and method(n) == "update"
            and text(receiver(n) or n) == name
            and n.lineno < line
        ):
            continue
        arg = n.args[0] if n.args and not n.keywords else None
        if isinstance(arg, ast.Name):
            more = _dict_keys(ctx, scope, arg.id, line, depth + 1)
        elif isinstance(arg, ast.Dict):
            more = _dict_keys_literal(arg)
        else:
            more = None
        if more is None:
            return None
        out.update(more)
    return out


def _dict_keys_literal(node: ast.Dict) -> dict[str, ast.expr] | None:
    out: dict[str, ast.expr] = {}
    for k, v in zip(node.keys, node.values, strict=True):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            return None
        out[k.value] = v
    return out


def _star_keywords(ctx: FileContext, call: ast.Call) -> dict[str, ast.expr] | None:
    """The keywords a call gets through `**name` (empty without any); None when unknown."""
    out: dict[str, ast.expr] = {}
    for kw in call.keywords:
        if kw.arg is not None:
            continue
        keys = None
        if isinstance(kw.value, ast.Name):
            keys = _dict_keys(ctx, ctx.scope(call), kw.value.id, call.lineno)
        elif isinstance(kw.value, ast.Dict):
            keys = _dict_keys_literal(kw.value)
        if keys is None:
            return None
        out.update(keys)
    return out


def _loaders_using(ctx: FileContext, sampler: ast.Call) -> list[ast.Call]:
    """DataLoaders (and BatchSamplers) that take the sampler, directly or by name (also
    through a keyword dict: `DataLoader(ds, **test_kwargs)`)."""
    names = _bound_names(ctx, sampler)
    out = []
    for n in ctx.nodes(ast.Call):
        assert isinstance(n, ast.Call)
        name = ctx.call_name(n) or ""
        if _LOADER.search(name):
            value = keyword(n, "sampler") or (_star_keywords(ctx, n) or {}).get("sampler")
            if value is None and len(n.args) >= 4:
                value = n.args[3]  # DataLoader(dataset, batch_size, shuffle, sampler, ...)
            if _uses(value, sampler, names):
                out.append(n)
        elif _BATCH_SAMPLER.search(name):
            value = keyword(n, "sampler") or (n.args[0] if n.args else None)
            if _uses(value, sampler, names):
                out.append(n)
    return out


def _sets_drop_last(ctx: FileContext, call: ast.Call) -> bool:
    """drop_last given: as a keyword, positionally to a BatchSampler, through
    `**kwargs` (a dict of this file that has it, or one we cannot see), or through a
    batch_sampler that sets it."""
    if keyword(call, "drop_last") is not None:
        return True
    if _BATCH_SAMPLER.search(ctx.call_name(call) or "") and len(call.args) >= 3:
        return True
    if keyword(call, "batch_sampler") is not None:
        return True
    star = _star_keywords(ctx, call)
    return star is None or "drop_last" in star or "batch_sampler" in star


_EVAL_DATA = re.compile(r"(?i)(?:^|[^a-z])(?:val|valid|validation|test|eval|dev)(?:[^a-z]|$)")


def _evaluation_sampler(ctx: FileContext, sampler: ast.Call) -> bool:
    """A sampler over validation or test data, by the dataset's or the sampler's name."""
    dataset = keyword(sampler, "dataset") or (sampler.args[0] if sampler.args else None)
    named = [text(dataset)] if dataset is not None else []
    named += list(_bound_names(ctx, sampler))
    return any(_EVAL_DATA.search(n) and "train" not in n.lower() for n in named)


def _sampler_drop_last(ctx: FileContext) -> Iterator[Hit]:
    for sampler in _samplers(ctx):
        if _sets_drop_last(ctx, sampler) or len(sampler.args) >= 6:  # positional drop_last
            continue
        if not _evaluation_sampler(ctx, sampler):
            continue  # padding a training epoch with a few repeats is harmless
        loaders = _loaders_using(ctx, sampler)
        if not loaders or any(_sets_drop_last(ctx, loader) for loader in loaders):
            continue
        yield Hit(sampler)


SAMPLER_DROP_LAST = Rule(
    code="TD502",
    name="distributed-sampler-drop-last",
    message="DistributedSampler over evaluation data pads with repeats: metrics count them twice",
    what=(
        "A DistributedSampler over validation or test data (by the dataset's or the "
        "sampler's name) created without drop_last, used by a DataLoader that does not set "
        "drop_last either (as a keyword, through **kwargs or a BatchSampler). An explicit "
        "drop_last=False (padding wanted) is not reported, and neither are training "
        "samplers: a few repeated samples per epoch do not matter there."
    ),
    why=(
        "By default the sampler pads the dataset with repeated samples so that every rank "
        "gets the same count: up to world_size - 1 samples are evaluated twice, so accuracy "
        "and loss averaged over the ranks are not those of the dataset, and they change "
        "with the number of GPUs. Say what you want: drop_last=False and trim the gathered "
        "results to len(dataset), or drop_last=True and accept a few samples left out."
    ),
    example=(
        "val_sampler = DistributedSampler(val_set, shuffle=False)\n"
        "val_loader = DataLoader(val_set, batch_size=64, sampler=val_sampler)"
    ),
    fix=(
        "val_sampler = DistributedSampler(val_set, shuffle=False, drop_last=False)\n"
        "val_loader = DataLoader(val_set, batch_size=64, sampler=val_sampler)\n"
        "# ... all_gather the predictions, then keep the first len(val_set) of them"
    ),
    check=_sampler_drop_last,
)


_EPOCH = re.compile(r"(?i)epoch")


def _sampler_set_epoch(ctx: FileContext) -> Iterator[Hit]:
    if any(method(n) == "set_epoch" for n in ctx.nodes(ast.Call)):
        return
    if not any(is_backward(ctx, n) for n in ctx.nodes(ast.Call)):
        return  # no hand-written training loop here (a framework drives the sampler)
    if not any(_EPOCH.search(text(loop.target)) for loop in ctx.nodes((ast.For, ast.AsyncFor))):  # type: ignore[attr-defined]
        return  # a single pass, or steps without epochs: nothing to reshuffle for
    for sampler in _samplers(ctx):
        shuffle = keyword(sampler, "shuffle")
        if is_const(shuffle, False) or has_star_kwargs(sampler) or len(sampler.args) >= 4:
            continue
        if terminal(sampler.func) is None:
            continue
        yield Hit(sampler)


SAMPLER_SET_EPOCH = Rule(
    code="TD503",
    name="distributed-sampler-without-set-epoch",
    message="DistributedSampler shuffles but set_epoch() is never called: same order every epoch",
    what=(
        "A file with a hand-written training loop and an epoch loop (`for epoch in ...`) "
        "that creates a shuffling DistributedSampler and never calls set_epoch on it. A "
        "single pass over the data is not reported."
    ),
    why=(
        "DistributedSampler seeds its shuffle with seed + epoch. Without set_epoch the epoch "
        "stays 0, so every epoch visits the samples in exactly the same order on every rank, "
        "which hurts generalisation."
    ),
    example=(
        "sampler = DistributedSampler(train_set, drop_last=True)\n"
        "loader = DataLoader(train_set, batch_size=64, sampler=sampler, drop_last=True)\n"
        "for epoch in range(epochs):\n"
        "    for x, y in loader:\n"
        "        optimizer.zero_grad()\n"
        "        criterion(model(x), y).backward()\n"
        "        optimizer.step()"
    ),
    fix=(
        "for epoch in range(epochs):\n"
        "    sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank\n"
        "    for x, y in loader:\n"
        "        ..."
    ),
    check=_sampler_set_epoch,
)

RULES = (COLLECTIVE_UNDER_RANK, SAMPLER_DROP_LAST, SAMPLER_SET_EPOCH)
