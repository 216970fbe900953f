"""TD5xx distributed: collectives some ranks never reach, samplers that pad or never
reshuffle."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.lint.context import (
    FUNCTIONS,
    FileContext,
    Hit,
    has_star_kwargs,
    is_const,
    keyword,
    method,
    terminal,
    text,
)
from torchdoctor.lint.engine import Rule
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


def _samplers(ctx: FileContext) -> list[ast.Call]:
    return [
        n
        for n in ctx.nodes(ast.Call)
        if isinstance(n, ast.Call) and _SAMPLER.search(ctx.call_name(n) or "")
    ]


def _loaders_using(ctx: FileContext, sampler: ast.Call) -> list[ast.Call]:
    names: set[str] = set()
    parent = ctx.parent(sampler)
    if isinstance(parent, ast.Assign):
        names = {text(t) for t in parent.targets}
    elif isinstance(parent, ast.NamedExpr):
        names = {text(parent.target)}
    out = []
    for n in ctx.nodes(ast.Call):
        assert isinstance(n, ast.Call)
        if not _LOADER.search(ctx.call_name(n) or ""):
            continue
        value = keyword(n, "sampler")
        if value is None and len(n.args) >= 4:
            value = n.args[3]  # DataLoader(dataset, batch_size, shuffle, sampler, ...)
        if value is sampler or (value is not None and text(value) in names):
            out.append(n)
    return out


def _sampler_drop_last(ctx: FileContext) -> Iterator[Hit]:
    for sampler in _samplers(ctx):
        if keyword(sampler, "drop_last") is not None or has_star_kwargs(sampler):
            continue
        if len(sampler.args) >= 6:  # positional drop_last
            continue
        loaders = _loaders_using(ctx, sampler)
        if any(
            keyword(loader, "drop_last") is not None or has_star_kwargs(loader)
            for loader in loaders
        ):
            continue
        yield Hit(sampler)


SAMPLER_DROP_LAST = Rule(
    code="TD502",
    name="distributed-sampler-drop-last",
    message="DistributedSampler without drop_last: it pads by repeating samples; say drop_last=",
    what=(
        "A DistributedSampler created without drop_last, whose DataLoader does not set "
        "drop_last either. An explicit drop_last=False (padding wanted) is not reported."
    ),
    why=(
        "By default the sampler pads the dataset with repeated samples so that every rank "
        "gets the same count: evaluation metrics count some samples twice, and the last "
        "batch is smaller than the others (new shapes for torch.compile and XLA, a BatchNorm "
        "batch that can shrink to one). drop_last=True keeps every rank on the same number "
        "of full batches, which collectives such as all_gather of per-batch outputs need."
    ),
    example=(
        "sampler = DistributedSampler(train_set)\n"
        "loader = DataLoader(train_set, batch_size=64, sampler=sampler)"
    ),
    fix=(
        "sampler = DistributedSampler(train_set, drop_last=True)\n"
        "loader = DataLoader(train_set, batch_size=64, sampler=sampler, drop_last=True)"
    ),
    check=_sampler_drop_last,
)


def _sampler_set_epoch(ctx: FileContext) -> Iterator[Hit]:
    if any(method(n) == "set_epoch" for n in ctx.nodes(ast.Call)):
        return
    if not any(is_backward(ctx, n) for n in ctx.nodes(ast.Call)):
        return  # no hand-written training loop here (a framework drives the sampler)
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
        "A file with a hand-written training loop that creates a shuffling "
        "DistributedSampler and never calls set_epoch on it."
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
