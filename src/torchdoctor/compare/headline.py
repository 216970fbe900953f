"""The one sentence that ties a comparison together: is B slower or faster per step, beyond
noise; what carries the change (the phase, and in the forward or backward pass the module or
group of repeated modules); which settings differ, the likeliest causes first; whether the loss
is bit-identical or from which step it differs; the peak memory and new findings when they
changed. ("B is 23% slower per step: backward of `encoder.layers.*.attn` +31 ms; B runs with
compile off (A: on)".)
"""

from __future__ import annotations

import dataclasses

from torchdoctor.compare.curves import Curves
from torchdoctor.compare.memory import MemoryChange
from torchdoctor.compare.record import Finding
from torchdoctor.compare.settings import Setting
from torchdoctor.compare.stats import Change
from torchdoctor.compare.timing import Cause, Collective, Straggler
from torchdoctor.units import human

MAX_SETTINGS = 3
KIND_WORDS = {
    "parameter": "parameters",
    "gradient": "gradients",
    "optimizer_state": "optimizer state",
    "activation": "activations",
    "buffer": "buffers",
    "other": "other memory",
}
# Settings that follow from another one: not said again when that one differs.
_FOLLOWS = {"prefetch_factor": "num_workers", "persistent_workers": "num_workers"}
PHASE_WORDS = {
    "data_wait": "waiting for data",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    "other": "time outside the phases (your code, logging)",
}


def seconds(value: float, sign: bool = False) -> str:
    prefix = ("+" if value > 0 else "-" if value < 0 else "") if sign else ""
    a = abs(value) if sign else value
    if abs(a) < 1e-3:
        return f"{prefix}{a * 1e6:.0f} us"
    if abs(a) < 1:
        return f"{prefix}{a * 1e3:.1f} ms"
    return f"{prefix}{a:.2f} s"


def step_words(step: Change) -> str:
    """'B is 23% slower per step (41.2 ms against 33.5 ms)', or the noise verdict."""
    if step.a is None or step.b is None:
        return "Step times were not recorded in both runs"
    if step.ratio is None or step.low is None:
        return (
            f"Too few steps to tell a difference in step time ({seconds(step.b)} against "
            f"{seconds(step.a)})"
        )
    if not step.real:
        return (
            f"No real difference in step time (B/A {step.ratio:.2f}, 95% interval "
            f"{step.low:.2f}..{step.high:.2f}: within noise)"
        )
    pct = abs(step.ratio - 1) * 100
    way = "slower" if step.ratio > 1 else "faster"
    return f"B is {pct:.0f}% {way} per step ({seconds(step.b)} against {seconds(step.a)})"


def waiting_words(s: Story) -> str:
    """A difference as measured that the wait for a CPU may account for."""
    m = s.measured
    assert m is not None and m.ratio is not None and m.low is not None
    pct = abs(m.ratio - 1) * 100
    way = "longer" if m.ratio > 1 else "shorter"
    wa, wb = s.waiting
    more = "B" if (wb or 0) > (wa or 0) else "A"
    return (
        f"No real difference in step time: B's steps are {pct:.0f}% {way} (95% interval "
        f"{m.low:.2f}..{m.high:.2f}), no more than {more}'s extra wait for a CPU can make them "
        f"(B waited for one {_share(wb)} of its time, A {_share(wa)})"
    )


def _aligned(s: Story) -> bool:
    """Whether the run that waited longer for a CPU is the one with the longer steps: only then
    is the wait a likely cause."""
    wa, wb = s.waiting
    m = s.measured or s.step
    if wa is None or wb is None or m.ratio is None:
        return False
    return (wb > wa) == (m.ratio > 1)


def _share(value: float | None) -> str:
    return "?" if value is None else f"{value:.0%}"


def cause_words(phase: str | None, phase_change: Change | None, cause: Cause | None) -> str:
    if cause is not None:
        many = f" ({cause.instances} modules)" if cause.instances > 1 else ""
        return f"{cause.stage} of `{cause.module}`{many} {seconds(cause.delta, sign=True)}"
    if phase is not None and phase_change is not None and phase_change.delta is not None:
        return f"{PHASE_WORDS[phase]} {seconds(phase_change.delta, sign=True)}"
    return ""


def setting_words(differing: list[Setting]) -> list[str]:
    keys = {s.key for s in differing}
    out = []
    for s in differing:
        # the same change said twice: parameters and compute dtype moved together
        if s.key == "compute_dtype" and "dtype" in keys:
            twin = next(x for x in differing if x.key == "dtype")
            if (twin.a, twin.b) == (s.a, s.b):
                continue
        if _FOLLOWS.get(s.key) in keys:
            continue
        if s.phrase:
            out.append(s.phrase)
        if len(out) == MAX_SETTINGS:
            break
    more = len([s for s in differing if s.phrase]) - len(out)
    if more > 0 and len(out) == MAX_SETTINGS:
        out.append(f"{more} more settings differ")
    return out


def curve_words(curves: Curves) -> str:
    loss = curves.loss
    if not loss.recorded or not loss.compared:
        return ""
    if loss.first_difference is None:
        grad = curves.grad_norm
        both = grad.recorded and grad.first_difference is None
        what = "loss and gradient norm" if both else "loss"
        return f"{what} bit-identical over {loss.compared} steps"
    text = f"loss differs from step {loss.first_difference}"
    change = loss.final_change
    if change is not None:
        text += f" (final loss {change * 100:+.1f}%)"
    return text


def memory_words(memory: MemoryChange) -> str:
    peak = memory.peak
    if not peak.changed or peak.delta is None:
        return ""
    text = f"peak memory {'+' if peak.delta > 0 else '-'}{human(abs(peak.delta))}"
    if memory.main_kind:
        text += f" (mostly {KIND_WORDS.get(memory.main_kind, memory.main_kind)})"
    return text


@dataclasses.dataclass(frozen=True)
class Story:
    """What the headline ties together."""

    step: Change
    curves: Curves
    memory: MemoryChange
    phase: str | None = None  # the phase that carries the step's change
    phase_change: Change | None = None
    cause: Cause | None = None  # the module that carries it
    differing: list[Setting] = dataclasses.field(default_factory=list)  # likeliest first
    new_findings: list[Finding] = dataclasses.field(default_factory=list)
    straggler: Straggler | None = None
    collectives: list[Collective] | None = None
    measured: Change | None = None  # as measured; `step` is judged allowing for the wait for a CPU
    waiting: tuple[float | None, float | None] = (None, None)  # share of each run's time


def headline(story: Story) -> str:
    s = story
    parts = []
    if s.step.real:
        what = cause_words(s.phase, s.phase_change, s.cause)
        if what:
            parts.append(what)
    if s.straggler is not None:
        parts.append(
            f"rank {s.straggler.rank}'s {PHASE_WORDS[s.straggler.phase]} "
            f"{seconds(s.straggler.delta, sign=True)} (the other ranks': "
            f"{seconds(s.straggler.others, sign=True)})"
        )
    differing = [x for x in s.differing if x.key != "waiting" or _aligned(s)]
    parts += setting_words(differing)
    moved = [c.phrase for c in s.collectives or () if c.phrase]
    parts += moved[:1]
    mem = memory_words(s.memory)
    if mem:
        parts.append(mem)
    for d in s.new_findings[:2]:
        where = f" on rank {d.rank}" if d.rank not in (None, 0) else ""
        parts.append(f"B has a new {d.kind}{where}")
    curve = curve_words(s.curves)
    if curve:
        parts.append(curve)
    quiet = not (differing or mem or s.new_findings or s.straggler or moved)
    if not s.step.real and s.measured is not None and s.measured.real:
        said = {x.phrase for x in s.differing if x.key == "waiting"}
        return "; ".join([waiting_words(s), *(p for p in parts if p not in said)])
    if not s.step.real and quiet:
        lead = step_words(s.step)
        if lead.startswith("No real difference"):
            lead = (
                "No real difference: step time within noise"
                + lead[len("No real difference in step time") :]
            )
        return "; ".join([lead, *parts, "the same settings"])
    joint = ": " if s.step.real else "; "
    return step_words(s.step) + (joint + "; ".join(parts) if parts else "")
