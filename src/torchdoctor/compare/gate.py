"""`--fail-if` for a CI gate: limits on how much worse B may be than A.

  slower:5%        B's step time is more than 5% above A's, beyond noise: the low end of the 95%
                   interval of the median ratio is above 1.05 (slower:20ms: the median step is
                   more than 20 ms longer, and the difference is real); when B's main thread
                   waited longer for a CPU than A's, 1.05 times what that wait can explain; and
                   always beyond the noise floor (10%, or --noise-floor)
  loss:2%          B's final loss (median of its last steps) is more than 2% above A's
                   (loss:0.05: more than 0.05 above it; loss:identical: the loss curves are not
                   bit-identical over the steps both runs have)
  memory:10%       B's peak memory is more than 10% above A's (memory:512MiB: more than that)

A limit that cannot be judged (a run without steps, without a loss) fails the gate: a CI job
must not pass over a gap.
"""

from __future__ import annotations

import dataclasses
import re

from torchdoctor.compare.record import Comparison, Verdict
from torchdoctor.units import human, parse_size

KINDS = ("slower", "loss", "memory")
_TIME = re.compile(r"^(\d+(?:\.\d+)?)\s*(us|ms|s)$")
_TIME_SCALE = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


class GateError(ValueError):
    """A --fail-if that cannot be read; the message says what is expected."""


@dataclasses.dataclass(frozen=True)
class Gate:
    kind: str
    limit: float  # a fraction when relative, else seconds, loss units or bytes
    relative: bool
    text: str  # as given
    exact: bool = False  # loss:identical


def parse(spec: str) -> list[Gate]:
    """'slower:5%' or several separated by commas."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        kind, sep, value = part.partition(":")
        kind, value = kind.strip().lower(), value.strip()
        if not sep or kind not in KINDS or not value:
            raise GateError(
                f"--fail-if {part!r}: expected slower:N%, loss:N% or memory:N% "
                "(also slower:20ms, loss:0.05, loss:identical, memory:512MiB)"
            )
        out.append(_limit(kind, value, part))
    return out


def _limit(kind: str, value: str, text: str) -> Gate:
    if value.endswith("%"):
        try:
            return Gate(kind, float(value[:-1]) / 100, True, text)
        except ValueError:
            raise GateError(f"--fail-if {text!r}: {value!r} is not a percentage") from None
    if kind == "loss" and value.lower() in ("identical", "exact"):
        return Gate(kind, 0.0, False, text, exact=True)
    try:
        if kind == "slower":
            m = _TIME.match(value.lower())
            if m is None:
                raise ValueError(value)
            return Gate(kind, float(m.group(1)) * _TIME_SCALE[m.group(2)], False, text)
        if kind == "memory":
            return Gate(kind, float(parse_size(value)), False, text)
        return Gate(kind, float(value), False, text)
    except ValueError:
        unit = {"slower": "a duration (20ms)", "memory": "a size (512MiB)", "loss": "a number"}
        raise GateError(f"--fail-if {text!r}: expected a percentage or {unit[kind]}") from None


def evaluate(gate: Gate, record: Comparison) -> Verdict:
    """The gate's verdict on a comparison record: exceeded or not, and why, in words."""
    judge = {"slower": _slower, "loss": _loss, "memory": _memory}[gate.kind]
    exceeded, why = judge(gate, record)
    return Verdict(gate.text, exceeded, why)


def _slower(gate: Gate, record: Comparison) -> tuple[bool, str]:
    step = record.step_time.change
    if step.a is None or step.b is None or step.low is None or step.high is None:
        return True, "step times cannot be compared (too few steps in a run)"
    low = step.low
    if gate.relative:
        # beyond what the extra wait for a CPU can make of it (a shared CI machine), and real
        limit = (1 + gate.limit) * record.step_time.machine_allows[0]
        exceeded = bool(step.real) and step.ratio is not None and step.ratio > 1 and low > limit
        return exceeded, (
            f"B/A step time {step.ratio:.3f}, 95% interval {low:.3f}..{step.high:.3f}"
            f" ({'above' if exceeded else 'not above'} {limit:.3f} throughout)"
        )
    delta = step.b - step.a
    exceeded = bool(step.real) and delta > gate.limit
    return exceeded, (
        f"median step {delta * 1e3:+.2f} ms ({'real' if step.real else 'noise'}; "
        f"limit {gate.limit * 1e3:.2f} ms)"
    )


def _loss(gate: Gate, record: Comparison) -> tuple[bool, str]:
    loss = record.curves.loss
    if not loss.recorded or not loss.compared:
        return True, "no loss recorded in both runs for the same steps"
    if gate.exact:
        first = loss.first_difference
        if first is None:
            return False, f"bit-identical over {loss.compared} steps"
        return True, f"the loss differs from step {first}"
    a, b = loss.final
    if a is None or b is None:
        return True, "no finite final loss in both runs"
    if gate.relative:
        limit = abs(a) * gate.limit
        exceeded = b - a > limit
        pct = f"{(b - a) / abs(a) * 100:+.2f}%" if a else f"{b - a:+.6g}"
        return exceeded, f"final loss {b:.6g} against {a:.6g} ({pct})"
    exceeded = b - a > gate.limit
    return exceeded, f"final loss {b:.6g} against {a:.6g} ({b - a:+.6g})"


def _memory(gate: Gate, record: Comparison) -> tuple[bool, str]:
    peak = record.memory.peak
    a, b = peak.a, peak.b
    if a is None or b is None:
        return True, "peak memory not recorded in both runs"
    limit = a * gate.limit if gate.relative else gate.limit
    exceeded = b - a > limit
    sign = "+" if b >= a else "-"
    return exceeded, f"peak {human(b)} against {human(a)} ({sign}{human(abs(b - a))})"
