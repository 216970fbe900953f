"""One story per run: the findings of a run, taken together. Pure: findings in, findings out;
the doctor applies it after every pass and records what it changed.

- A chain: findings that follow from one cause are linked, earliest first. Gradients that
  explode, a loss that diverges and a NaN are one story (`CHAIN`): each `follows` the one
  found just before it (by step; at one step exploding gradients come first, a NaN last), at
  most GAP steps before it (or the divergence that named the NaN's step). A NaN in the input
  batch follows nothing. A standing cause (`STANDING`: gradients never cleared, true on every
  update once found) heads the chain: its first finding follows it however many steps later,
  and their fixes point to it instead of clipping or a lower learning rate, which would only
  hide it. A finding that another kind explains (`EXPLAINED_BY`: every gradient zero, after a
  loss over one class) follows it.
- No two fixes contradict each other: while the run shows the learning rate too large (the
  loss diverged, gradients exploded, or a NaN is blamed on it), not_learning does not also
  ask for a larger one.
- Wording the modules share, so that the fixes say the same thing the same way, and say so
  when a value they need is not known (a loop without torch.optim has no learning rate to
  read) instead of printing None.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from torchdoctor.diagnose.record import Diagnosis

CHAIN = ("exploding_gradients", "divergence", "nan")
GAP = 100  # steps: a finding of the chain this soon after an earlier one follows from it
# Findings true on every update from their step on: gradients that pile up across updates grow
# the norm step after step until it explodes, the loss runs away and turns NaN.
STANDING = ("grad_not_cleared",)
# Findings that another kind explains when it saw the cause: every gradient exactly zero, from a
# loss over one class (loss_inputs' single_class).
EXPLAINED_BY = {"zero_gradients": ("loss_inputs",)}

LOWER_LR = "lower the learning rate"
RAISE_LR = "try a larger learning rate"
# How the chain's fixes begin that would hide a standing cause rather than remove it.
CLIP_NORM = "clip the gradient norm"
ADD_CLIPPING = "add gradient clipping"
WARM_UP = "add a learning-rate warm-up"
LR_UNKNOWN = (
    "its value is not known: no torch.optim optimizer had stepped by then; for an update of "
    "your own, look at its step size"
)


def lr_now(lr: float | None) -> str:
    """`(now 0.1)`, or what to look at when the learning rate is not known."""
    return f"(now {lr:g})" if lr is not None else f"({LR_UNKNOWN})"


def tell(found: Sequence[Diagnosis]) -> list[Diagnosis]:
    """The findings as one story: each linked to the finding it follows from, and the fixes
    made consistent. A finding that changes is a new object; the others are returned as they
    are."""
    linked = [_linked(d, found) for d in found]
    return [_reconciled(d, linked) for d in linked]


def _linked(d: Diagnosis, found: Sequence[Diagnosis]) -> Diagnosis:
    if d.kind in EXPLAINED_BY:
        return _explained(d, found)
    if d.kind not in CHAIN or d.step is None:
        return d
    if d.evidence.has_no_cause():
        return d  # a bad batch: nothing before it led there
    cause: Diagnosis | None = None
    for earlier in found:
        if earlier is d or earlier.kind not in CHAIN or earlier.kind == d.kind:
            continue
        if earlier.step is None or earlier.rank != d.rank or not _before(earlier, d):
            continue
        named = earlier.evidence.names_step() == d.step
        if d.step - earlier.step > GAP and not named:
            continue
        if cause is None or _before(cause, earlier):
            cause = earlier  # the one just before: the chain is a line, earliest first
    if cause is None:
        cause = _standing(d, found)
    follows = cause.kind if cause is not None else None
    return d if follows == d.follows else dataclasses.replace(d, follows=follows)


def _explained(d: Diagnosis, found: Sequence[Diagnosis]) -> Diagnosis:
    """d follows a finding of a kind that explains it."""
    cause = _earlier_cause(d, found, EXPLAINED_BY[d.kind])
    follows = cause.kind if cause is not None else None
    return d if follows == d.follows else dataclasses.replace(d, follows=follows)


def _standing(d: Diagnosis, found: Sequence[Diagnosis]) -> Diagnosis | None:
    """A standing cause on d's rank found at or before d's step, still true."""
    return _earlier_cause(d, found, STANDING)


def _earlier_cause(
    d: Diagnosis, found: Sequence[Diagnosis], kinds: Sequence[str]
) -> Diagnosis | None:
    """The first finding of one of `kinds` on d's rank, found at or before d's step, still
    true."""
    if d.step is None:
        return None
    for cause in found:
        if cause.kind not in kinds or cause.resolved is not None or cause.rank != d.rank:
            continue
        if cause.step is not None and cause.step <= d.step:
            return cause
    return None


def _root(d: Diagnosis, found: Sequence[Diagnosis]) -> Diagnosis:
    """The first finding of d's chain (d itself when it follows nothing)."""
    by_kind = {f.kind: f for f in found if f.rank == d.rank}
    seen = {d.kind}
    while d.follows is not None and d.follows in by_kind and d.follows not in seen:
        d = by_kind[d.follows]
        seen.add(d.kind)
    return d


def _before(a: Diagnosis, b: Diagnosis) -> bool:
    """Whether `a` comes before `b` in a chain: by step, and at one step in CHAIN's order."""
    return (a.step or 0, CHAIN.index(a.kind)) < (b.step or 0, CHAIN.index(b.kind))


def _too_large(found: Sequence[Diagnosis]) -> Diagnosis | None:
    """A finding that shows the learning rate too large rather than too small, if any."""
    for d in found:
        if d.resolved is not None or _root(d, found).kind in STANDING:
            continue
        if d.kind in ("divergence", "exploding_gradients"):
            return d
        if d.kind == "nan" and any(f.startswith(LOWER_LR) for f in d.fix[:2]):
            return d
    return None


def _reconciled(d: Diagnosis, found: Sequence[Diagnosis]) -> Diagnosis:
    if d.kind in CHAIN:
        return _pointed_to_cause(d, found)
    if d.kind != "not_learning" or d.resolved is not None:
        return d
    against = _too_large(found)
    if against is None or not any(f.startswith(RAISE_LR) for f in d.fix):
        return d
    when = f" at step {against.step}" if against.step is not None else ""
    instead = (
        f"do not raise the learning rate: {against.kind.replace('_', ' ')}{when} says it is "
        "already too large for this model; look at the data, the loss and the initialisation"
    )
    fixes = [instead if f.startswith(RAISE_LR) else f for f in d.fix]
    return dataclasses.replace(d, fix=fixes)


_HIDING = (LOWER_LR, CLIP_NORM, ADD_CLIPPING, WARM_UP)
_FOLLOWS = ": this follows from it; clipping or a lower learning rate would only hide it"


def _pointed_to_cause(d: Diagnosis, found: Sequence[Diagnosis]) -> Diagnosis:
    root = _root(d, found)
    if root is d or root.kind not in STANDING:
        return d
    first = f"fix {root.kind} first (step {root.step}){_FOLLOWS}"
    # (a finding told before, as the doctor keeps it, already has a pointer: replaced)
    kept = [f for f in d.fix if not f.startswith(_HIDING) and _FOLLOWS not in f]
    fixes = [first, *kept]
    return d if fixes == d.fix else dataclasses.replace(d, fix=fixes)


T = TypeVar("T")


def chains(
    items: Sequence[T], kind: Callable[[T], Any], follows: Callable[[T], Any]
) -> list[list[T]]:
    """The items grouped as the story tells them: each chain its first finding, then those
    that follow it in order; items in their given order otherwise. `kind` and `follows` read an
    item (a Diagnosis, or a saved row as a dict)."""
    kinds = {kind(item) for item in items}
    after: dict[Any, list[T]] = {}
    heads: list[T] = []
    for item in items:
        cause = follows(item)
        if cause is not None and cause in kinds and cause != kind(item):
            after.setdefault(cause, []).append(item)
        else:
            heads.append(item)
    out = []
    placed: set[int] = set()
    for head in heads:
        chain, frontier = [head], [head]
        placed.add(id(head))
        while frontier:
            nxt = [i for f in frontier for i in after.get(kind(f), []) if id(i) not in placed]
            placed.update(id(i) for i in nxt)
            chain += nxt
            frontier = nxt
        out.append(chain)
    rest = [i for i in items if id(i) not in placed]  # a cycle, which the story never makes
    return out + [[i] for i in rest]
