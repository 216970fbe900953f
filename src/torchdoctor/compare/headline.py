"""The one sentence that ties a comparison together: is B slower or faster per step, beyond
noise; what carries the change (the phase, and in the forward or backward pass the module or
group of repeated modules); which settings differ, the likeliest causes first; whether the loss
is bit-identical or from which step it differs; the peak memory and new findings when they
changed. ("B is 23% slower per step: backward of `encoder.layers.*.attn` +31 ms; B runs with
compile off (A: on)".)
"""

from __future__ import annotations

from typing import Any

from torchdoctor.compare.settings import Setting
from torchdoctor.compare.stats import Change
from torchdoctor.compare.timing import Cause
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


def curve_words(curves: dict[str, Any]) -> str:
    loss = curves.get("loss") or {}
    if not loss.get("recorded") or not loss.get("compared"):
        return ""
    if loss.get("first_difference") is None:
        grad = curves.get("grad_norm") or {}
        both = grad.get("recorded") and grad.get("first_difference") is None
        what = "loss and gradient norm" if both else "loss"
        return f"{what} bit-identical over {loss['compared']} steps"
    text = f"loss differs from step {loss['first_difference']}"
    change = loss.get("final_change")
    if change is not None:
        text += f" (final loss {change * 100:+.1f}%)"
    return text


def memory_words(memory: dict[str, Any]) -> str:
    peak = memory.get("peak") or {}
    if not peak.get("changed"):
        return ""
    text = f"peak memory {'+' if peak['delta'] > 0 else '-'}{human(abs(peak['delta']))}"
    if memory.get("main_kind"):
        text += f" (mostly {KIND_WORDS.get(memory['main_kind'], memory['main_kind'])})"
    return text


def headline(
    step: Change,
    phase: str | None,
    phase_change: Change | None,
    cause: Cause | None,
    differing: list[Setting],
    curves: dict[str, Any],
    memory: dict[str, Any],
    new_findings: list[dict[str, Any]],
    straggler: dict[str, Any] | None = None,
) -> str:
    parts = []
    if step.real:
        what = cause_words(phase, phase_change, cause)
        if what:
            parts.append(what)
    if straggler is not None:
        parts.append(
            f"rank {straggler['rank']}'s {PHASE_WORDS[straggler['phase']]} "
            f"{seconds(straggler['delta'], sign=True)} (the other ranks': "
            f"{seconds(straggler['others'], sign=True)})"
        )
    parts += setting_words(differing)
    mem = memory_words(memory)
    if mem:
        parts.append(mem)
    for d in new_findings[:2]:
        where = f" on rank {d['rank']}" if d.get("rank") not in (None, 0) else ""
        parts.append(f"B has a new {d['kind']}{where}")
    curve = curve_words(curves)
    if curve:
        parts.append(curve)
    if not step.real and not differing and not mem and not new_findings and not straggler:
        lead = step_words(step)
        if lead.startswith("No real difference"):
            lead = (
                "No real difference: step time within noise"
                + lead[len("No real difference in step time") :]
            )
        return "; ".join([lead, *parts, "the same settings"])
    joint = ": " if step.real else "; "
    return step_words(step) + (joint + "; ".join(parts) if parts else "")
