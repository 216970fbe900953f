"""Memory, B against A: the peak, the memory at the end of each phase of the traced steps, and
the kinds of tensors that account for the change.

On CUDA the figures are the caching allocator's, and the peak is its own (max_allocated). On CPU
they are the process's resident set size (which holds the interpreter and torch too), and the
peak is the highest reading at a step's or a traced phase's end: the process's lifetime peak
(ru_maxrss) counts whatever the process did before the training, and never comes down.

Kinds: parameters and their gradients are counted exactly from python.modules (elements times
the dtype's size; a gradient for each trainable parameter); activations are what the forward
pass adds (memory at its end less memory before it, median over the traced steps); a live
process's census (python.tensors) gives every kind, the optimizer's state included. The rest of
the peak is "other" (on CPU: the interpreter, torch, and tensors of no other kind).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from torchdoctor.compare.facts import RunFacts

PHASES = ("forward", "backward", "optimizer")
MIN_CHANGE = 0.10  # of A's peak: a smaller change of the peak is not named
MIN_BYTES = 1 << 20
ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def peak(f: RunFacts, steps: dict[str, np.ndarray]) -> float | None:
    if on_cuda(f):
        v = steps["max_allocated"]
    else:
        phases = [float(r["allocated"]) for r in f.memory if r["allocated"] is not None]
        v = np.concatenate([steps["allocated"], np.asarray(phases, dtype=np.float64)])
    v = v[np.isfinite(v)]
    return float(v.max()) if len(v) else None


def phase_peaks(f: RunFacts) -> dict[str, float]:
    """The highest memory at the end of each phase, over the traced steps."""
    out: dict[str, float] = {}
    for row in f.memory:
        phase, value = str(row["phase"]), row["allocated"]
        if phase in PHASES and value is not None:
            out[phase] = max(out.get(phase, 0.0), float(value))
    return out


def activations(f: RunFacts) -> float | None:
    """Median over traced steps of what the forward pass added to memory."""
    added = []
    before = None
    for row in f.memory:  # in time order
        if row["phase"] == "forward" and before is not None:
            added.append(float(row["allocated"]) - before)
        before = None if row["allocated"] is None else float(row["allocated"])
    return float(np.median(added)) if added else None


def kinds(f: RunFacts, top: float | None) -> dict[str, float]:
    """Bytes by kind of tensor: the live census where there is one, else estimated, with the
    rest of the peak `top` as "other"."""
    if f.census:
        return {k: float(v) for k, v in f.census.items()}
    params = grads = 0.0
    for p in f.params:
        size = ITEMSIZE.get(str(p.get("dtype") or ""), 0)
        params += float(p.get("params") or 0) * size
        grads += float(p.get("trainable") or 0) * size
    out: dict[str, float] = {}
    if params:
        out["parameter"] = params
        out["gradient"] = grads
    act = activations(f)
    if act is not None:
        out["activation"] = max(act, 0.0)
    if top is not None:
        out["other"] = max(top - sum(out.values()), 0.0)
    return out


@dataclasses.dataclass(frozen=True)
class Peak:
    a: float | None
    b: float | None
    delta: float | None
    changed: bool  # by at least MIN_CHANGE of A's peak and MIN_BYTES


@dataclasses.dataclass(frozen=True)
class Pair:
    """Memory at the end of a phase in each run."""

    a: float | None
    b: float | None


@dataclasses.dataclass(frozen=True)
class KindBytes:
    a: float | None
    b: float | None
    delta: float  # a kind absent from a run counts as 0 there


@dataclasses.dataclass(frozen=True)
class MemoryChange:
    peak: Peak
    phases: dict[str, Pair]  # in PHASES order, those either run has
    kinds: dict[str, KindBytes]  # by kind of tensor, sorted
    kinds_from: str  # "census" (both runs live) or "estimate"
    main_kind: str | None  # the kind that moved most in the peak's direction, when it changed
    device: str  # "cuda" or "cpu"


def compare_memory(
    a: RunFacts, b: RunFacts, sa: dict[str, np.ndarray], sb: dict[str, np.ndarray]
) -> MemoryChange:
    pa, pb = peak(a, sa), peak(b, sb)
    ka, kb = kinds(a, pa), kinds(b, pb)
    by_kind = {
        k: KindBytes(ka.get(k), kb.get(k), kb.get(k, 0.0) - ka.get(k, 0.0))
        for k in sorted(set(ka) | set(kb))
    }
    delta = None if pa is None or pb is None else pb - pa
    changed = delta is not None and pa is not None and abs(delta) >= max(MIN_CHANGE * pa, MIN_BYTES)
    # the kind that moved most in the peak's direction
    main = None
    if changed and by_kind and delta is not None:
        sign = 1.0 if delta > 0 else -1.0
        k, row = max(by_kind.items(), key=lambda kv: sign * kv[1].delta)
        if sign * row.delta > 0:
            main = k
    ph_a, ph_b = phase_peaks(a), phase_peaks(b)
    return MemoryChange(
        peak=Peak(pa, pb, delta, changed),
        phases={p: Pair(ph_a.get(p), ph_b.get(p)) for p in PHASES if p in ph_a or p in ph_b},
        kinds=by_kind,
        kinds_from="census" if (a.census and b.census) else "estimate",
        main_kind=main,
        device="cuda" if on_cuda(a) or on_cuda(b) else "cpu",
    )


def on_cuda(f: RunFacts) -> bool:
    return any(str(p.get("device") or "").startswith("cuda") for p in f.params)
