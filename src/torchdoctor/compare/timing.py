"""Where the time went, B against A: the step, each phase, and the modules.

Steps: each run's primary rank, without its first steps (start-up, lazy initialisation: up to
WARMUP, at most a fifth of the run); and without the traced steps (module hooks make them
slower) when both runs have at least MIN_UNTRACED others. The step time is compared as the
ratio of medians with its bootstrap interval (stats.py); a phase likewise, and it is real only
when it also moved by at least MIN_PHASE_SHARE of A's step.

Modules: each module's time per traced step (forward, and backward), inclusive of its children,
compared the same way. The module that explains a phase's change is found from the top: from
the model down, into the child (or the group of repeated children, `blocks.*.attn`) that
carries at least CARRY of its parent's change, as long as one does.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from torchdoctor.compare.facts import RunFacts
from torchdoctor.compare.stats import MIN_EFFECT, Change, change
from torchdoctor.units import human

PHASES = ("data_wait", "forward", "backward", "optimizer", "other")
WARMUP = 5
MIN_UNTRACED = 10
MIN_PHASE_SHARE = 0.02  # of A's median step
MIN_MODULE_SHARE = 0.02  # of A's median step
MIN_MODULE_SECONDS = 50e-6
CARRY = 0.6  # a child explains its parent's change when it carries this share of it
ONE_OF_GROUP = 0.8  # one member of a group carries the group's change alone
MAX_MODULES = 20
COLLECTIVES_APART = 0.1  # calls per step or bytes per call this far apart: a change
_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")


def timed_steps(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], str]:
    """The steps whose times are compared, and in words which they are."""

    def settled(s: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        skip = min(WARMUP, len(s["step"]) // 5)
        return {k: v[skip:] for k, v in s.items()}

    sa, sb = settled(a), settled(b)
    ua, ub = ~sa["traced"], ~sb["traced"]
    if ua.sum() >= MIN_UNTRACED and ub.sum() >= MIN_UNTRACED:
        basis = "steps without module tracing, after the first few"
        return _take(sa, ua), _take(sb, ub), basis
    return sa, sb, "every step after the first few"


def _take(s: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in s.items()}


def step_time(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], noise: float = MIN_EFFECT
) -> Change:
    return change(a["duration"], b["duration"], min_effect=noise)


def phases(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], step_a: float, noise: float = MIN_EFFECT
) -> dict[str, Change]:
    floor = MIN_PHASE_SHARE * step_a
    return {p: change(a[p], b[p], min_delta=floor, min_effect=noise) for p in PHASES}


# -- modules ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModuleChange:
    module: str
    type: str
    depth: int
    stage: str
    change: Change
    share: tuple[float | None, float | None]  # of each run's median step
    status: str  # "both", "new" (only in B), "vanished" (only in A)

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "type": self.type,
            "stage": self.stage,
            "status": self.status,
            "share": list(self.share),
            **self.change.to_json(),
        }


def module_changes(
    a: RunFacts,
    b: RunFacts,
    step_a: float | None,
    step_b: float | None,
    noise: float = MIN_EFFECT,
) -> list[ModuleChange]:
    """Every (module, stage) traced in either run, the largest absolute change first."""
    ia = {(m.module, m.stage): m for m in a.modules}
    ib = {(m.module, m.stage): m for m in b.modules}
    floor = max(MIN_MODULE_SECONDS, MIN_MODULE_SHARE * (step_a or 0.0))
    out = []
    for key in sorted(set(ia) | set(ib)):
        ma, mb = ia.get(key), ib.get(key)
        if (ma is None or mb is None) and not (a.modules and b.modules):
            continue  # one run traced no modules at all: nothing is new or gone
        status = "both" if ma and mb else ("new" if mb else "vanished")
        any_m = ma or mb
        assert any_m is not None
        ch = change(
            ma.seconds if ma else [0.0], mb.seconds if mb else [0.0], floor, min_effect=noise
        )
        share = (_share(ch.a, step_a), _share(ch.b, step_b))
        out.append(ModuleChange(any_m.module, any_m.type, any_m.depth, key[1], ch, share, status))
    out.sort(key=lambda m: -abs(m.change.delta or 0.0))
    return out


def _share(value: float | None, step: float | None) -> float | None:
    return None if value is None or not step else value / step


def pattern(name: str) -> str:
    """blocks.3.attn -> blocks.*.attn: the name shared by repeated modules."""
    return _INDEX.sub("*", name)


@dataclasses.dataclass(frozen=True)
class Cause:
    """The module (or group of repeated modules) whose change explains a phase's."""

    stage: str
    module: str  # a name, or a pattern with * for a group
    delta: float  # seconds per traced step, summed over the group
    instances: int
    change: Change | None  # the module's own, for one module

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "module": self.module,
            "delta": self.delta,
            "instances": self.instances,
            "change": None if self.change is None else self.change.to_json(),
        }


def attribute(changes: Iterable[ModuleChange], stage: str, direction: float) -> Cause | None:
    """From the model down to the innermost module (or group) that carries the change of
    `stage` in `direction` (+1 slower, -1 faster)."""
    mine = {m.module: m for m in changes if m.stage == stage}
    if not mine:
        return None
    delta = {name: (m.change.delta or 0.0) * direction for name, m in mine.items()}
    parent = {name: _parent(name, mine) for name in mine}
    roots = [n for n, m in mine.items() if m.depth == 0] or [n for n in mine if parent[n] is None]
    if len(roots) == 1:  # a model's children are named without its own label
        for name in mine:
            if parent[name] is None and name != roots[0]:
                parent[name] = roots[0]
    top = max(roots, key=lambda n: delta[n])
    if delta[top] <= 0:
        return None
    current, label = [top], top
    while True:
        total = sum(delta[n] for n in current)
        groups: dict[str, list[str]] = {}
        for name in mine:
            if parent[name] in current:
                groups.setdefault(pattern(name), []).append(name)
        if not groups:
            break
        best = max(groups.values(), key=lambda g: sum(delta[n] for n in g))
        carried = sum(delta[n] for n in best)
        if carried < CARRY * total:
            break
        leader = max(best, key=lambda n: delta[n])
        if len(best) == 1 or delta[leader] >= ONE_OF_GROUP * carried:
            current, label = [leader], leader
        else:
            current, label = best, pattern(best[0])
    total = sum(delta[n] for n in current) * direction
    own = mine[current[0]].change if len(current) == 1 else None
    return Cause(stage, label, total, len(current), own)


def _parent(name: str, known: dict[str, Any]) -> str | None:
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in known:
            return prefix
    return None


def module_sets(f: RunFacts) -> set[str]:
    """The modules of the run's watched models, by name (traced or not)."""
    names = {str(p["name"]) for p in f.params if p.get("name")}
    return names | {m.module for m in f.modules if m.depth > 0}


def new_and_vanished(a: RunFacts, b: RunFacts) -> tuple[list[str], list[str]]:
    sa, sb = module_sets(a), module_sets(b)
    if not sa or not sb:
        return [], []
    return sorted(sb - sa), sorted(sa - sb)


# -- ranks and collectives -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RankTimes:
    """One rank of a job: its median step time and phases, B against A, or the run it is
    `only_in` ("A" or "B")."""

    rank: int
    step_time: Change | None = None
    phases: dict[str, Change] | None = None
    only_in: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.step_time is None:
            return {"rank": self.rank, "in": self.only_in}
        return {"rank": self.rank, "step_time": self.step_time, "phases": self.phases}


def ranks(a: RunFacts, b: RunFacts, noise: float = MIN_EFFECT) -> list[RankTimes] | None:
    """Per rank of a job: median step time and phases in each run."""
    if len(a.ranks) < 2 and len(b.ranks) < 2:
        return None
    out: list[RankTimes] = []
    for rank in sorted(set(a.ranks) | set(b.ranks)):
        ra, rb = a.rank_steps(rank), b.rank_steps(rank)
        if not len(ra["step"]) or not len(rb["step"]):
            out.append(RankTimes(rank, only_in="B" if len(rb["step"]) else "A"))
            continue
        ta, tb, _basis = timed_steps(ra, rb)
        step = step_time(ta, tb, noise)
        out.append(RankTimes(rank, step, phases(ta, tb, step.a or 0.0, noise)))
    return out


@dataclasses.dataclass(frozen=True)
class Straggler:
    """A rank whose phase got slower by `delta` seconds while the other ranks' same phase
    changed by `others` (their median)."""

    rank: int
    phase: str
    delta: float
    others: float


def straggler(rows: list[RankTimes] | None) -> Straggler | None:
    """The rank of a job whose phase got slower when the other ranks' same phase did not (by
    less than half as much): a new straggler, and where its time went."""
    if not rows:
        return None
    both = [(r.rank, r.phases) for r in rows if r.phases is not None]
    if len(both) < 2:
        return None
    best: Straggler | None = None
    for phase in PHASES:
        deltas = {rank: ph[phase].delta or 0.0 for rank, ph in both}
        for rank, ph in both:
            c = ph[phase]
            if not c.real or c.delta is None or c.delta <= 0:
                continue
            others = float(np.median([d for k, d in deltas.items() if k != rank]))
            if others >= 0.5 * c.delta:
                continue
            if best is None or c.delta - others > best.delta - best.others:
                best = Straggler(rank, phase, c.delta, others)
    return best


@dataclasses.dataclass(frozen=True)
class Collective:
    """One (group, op) of a job, summed over ranks: calls per step and rank, and bytes per
    call, in A and in B (None: the run has none)."""

    group: str
    op: str
    per_step: tuple[float | None, float | None]
    bytes_per_call: tuple[float | None, float | None]
    phrase: str  # the headline's words when they moved apart ("" when they did not)


def collectives(a: RunFacts, b: RunFacts) -> list[Collective] | None:
    """Per (group, op), summed over ranks: calls per step and bytes per call in each run."""
    if not a.collectives and not b.collectives:
        return None

    def per(f: RunFacts) -> dict[tuple[str, str], dict[str, float]]:
        out: dict[tuple[str, str], dict[str, float]] = {}
        steps = max(len(f.rank_steps(f.primary)["step"]), 1)
        for r in f.collectives:
            key = (str(r["group"]), str(r["op"]))
            row = out.setdefault(key, {"calls": 0.0, "bytes": 0.0, "ranks": 0.0})
            row["calls"] += float(r["calls"] or 0)
            row["bytes"] += float(r["bytes"] or 0)
            row["ranks"] += 1
        for row in out.values():
            ranks = max(row["ranks"], 1.0)
            row["per_step"] = row["calls"] / ranks / steps
            row["bytes_per_call"] = row["bytes"] / row["calls"] if row["calls"] else 0.0
        return out

    pa, pb = per(a), per(b)
    rows = []
    for key in sorted(set(pa) | set(pb)):
        x, y = pa.get(key), pb.get(key)
        op = f"{key[1]}" + ("" if key[0] == "default" else f" ({key[0]})")
        phrase = ""
        if x is None or y is None:
            phrase = f"B {'issues' if y else 'no longer issues'} {op}"
        elif _apart(x["per_step"], y["per_step"]):
            phrase = f"B issues {y['per_step']:.3g} {op} per step (A: {x['per_step']:.3g})"
        elif _apart(x["bytes_per_call"], y["bytes_per_call"]):
            phrase = (
                f"B's {op} moves {human(y['bytes_per_call'])} per call "
                f"(A: {human(x['bytes_per_call'])})"
            )
        rows.append(
            Collective(
                key[0],
                key[1],
                (_get(x, "per_step"), _get(y, "per_step")),
                (_get(x, "bytes_per_call"), _get(y, "bytes_per_call")),
                phrase,
            )
        )
    return rows


def _get(row: dict[str, float] | None, key: str) -> float | None:
    return None if row is None else row[key]


def _apart(x: float, y: float) -> bool:
    return abs(y - x) > COLLECTIVES_APART * max(abs(x), abs(y), 1e-12)
