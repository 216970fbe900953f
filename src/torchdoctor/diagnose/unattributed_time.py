"""`unattributed_time`: much of each step runs outside every phase (not the models' forward,
not backward(), not optimizer.step(), not waiting for a DataLoader) and no input function
claims it: what the loop does there is said, or that it is not known.

The time is the steps' `other` column. Stack samples of it (telemetry/gap_sampler.py, taken
when a run spends OTHER_SHARE of its steps there) name the function it goes to; when that is
the loop's own input function, dataloader_bound reports it, from the step it was found (the
rows before it are left to dataloader_bound). Without samples (a run that ended before the
sampler looked) the run's last pass says the time is unexplained rather than let the run read as
having no problem: where torchdoctor cannot see, it says so (a live pass waits: the doctor has
asked for samples). Info only: the time may be the loop's own legitimate work (an
environment's steps between updates, logging), and the finding says where it goes."""

from __future__ import annotations

import dataclasses

import numpy as np

# the same window of recent steps as dataloader_bound, which claims the input function's share
from torchdoctor.diagnose.dataloader_bound import MIN_STEPS, WARMUP, WINDOW, input_function
from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.parts import SampledFunction
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.rollout import is_rollout

RESOLVES = True  # it describes the recent steps: when they change, it no longer holds

# The share of step time outside every phase, and the seconds a step, from which the time is
# worth sampling (gap_sampler.worth_sampling) and, unexplained, worth saying.
OTHER_SHARE = 0.3
MIN_OTHER = 0.001
# Unsampled, the time is said to be unknown only when there is enough of it to matter: a run
# of a few dozen millisecond steps (the README's demo) spends it mostly beside torchdoctor's
# own start (its doctor loading the diagnoses, on a loaded machine), not in the loop's work.
MIN_UNSAMPLED = 0.1  # seconds of `other` in the window


def _typical(other: np.ndarray, duration: np.ndarray) -> bool:
    """Whether the typical (median) step spends the time too. Unsampled, nothing says where
    the time went: on a loaded machine the loop is preempted in a few steps and their wall
    time lands in `other` (0.3 ms a step, then 8 to 17 ms in 1 step of 5, on the README's run
    beside a busy suite), which the sums alone read as a loop that spends half its time
    there."""
    typical = float(np.median(other))
    return typical >= MIN_OTHER and typical >= OTHER_SHARE * float(np.median(duration))


@kind("unattributed_time")
@dataclasses.dataclass(kw_only=True)
class UnattributedTimeEvidence(Evidence):
    other_share: float  # of the window's step time
    other_per_step: float  # seconds
    steps: int
    gap: str | None = optional()  # the phase the sampled gap follows (phases.py)
    top: list[SampledFunction] | None = optional()  # what its samples spent the time in


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    steps = inputs.column("step")[WARMUP:][-WINDOW:]
    other = np.nan_to_num(inputs.column("other")[WARMUP:][-WINDOW:])
    duration = inputs.column("duration")[WARMUP:][-WINDOW:]
    found = input_function(inputs)
    if found is not None and found.from_step is not None:
        after = steps > int(found.from_step)  # before it, its time is still in `other`
        other, duration = other[after], duration[after]
    total = float(duration.sum())
    if other.size < MIN_STEPS or total <= 0:
        return []
    share = float(other.sum()) / total
    per_step = float(other.mean())
    if share < OTHER_SHARE or per_step < MIN_OTHER:
        return []
    evidence = UnattributedTimeEvidence(
        other_share=share, other_per_step=per_step, steps=other.size
    )
    head = (
        f"{share:.0%} of step time ({per_step * 1e3:.1f} ms a step) runs outside the model's "
        "forward pass, backward() and optimizer.step()"
    )
    sampled = _largest_gap(inputs)
    if sampled is None:
        if not inputs.final or float(other.sum()) < MIN_UNSAMPLED:
            return []  # the doctor has asked for samples: they name it; or too little to say
        if not _typical(other, duration):
            return []  # a few steps preempted by a busy machine, not the loop's own work
        return [
            _finding(
                inputs,
                f"{head}, and it was not sampled (the run ended before the stack sampler "
                "looked), so what the loop does there is not known.",
                None,
                evidence,
                [
                    "see where it goes while the run runs: torchdoctor PID backtrace, a few "
                    "times (or py-spy dump --pid PID)",
                    f"run longer: torchdoctor samples that time once the steps spend "
                    f"{OTHER_SHARE:.0%} there, and names the function",
                ],
            )
        ]
    gap, top = sampled
    evidence.gap, evidence.top = gap, top
    first = top[0]
    what = f"{first.function}()" if first.function else "the loop's own line"
    line = f" (`{first.code}`)" if first.code else ""
    fixes = [
        f"if {what} is bookkeeping (logging, metrics, checkpoints), run it every N "
        "steps or off the training thread",
        "if the step needs it (an environment's steps, a batch built by hand), that is "
        "where the step's time goes: make it cheaper, or overlap it with the model (a "
        "DataLoader with workers, a background thread filling a queue)",
    ]
    direct = first.function == "forward" and ".forward(" in (first.code or "")
    if direct:  # a module's forward called as a method: no hook of the module runs
        what = "a module's forward() called directly"
        fixes[0] = (  # not bookkeeping: the model's own work, unseen
            "call the module, not its forward() (`model(x)` for `model.forward(x)`): its "
            "hooks run (torchdoctor's too), and its time is the forward pass's"
        )
    elif is_rollout(inputs):  # an RL loop: the time between the policy's calls is the episode's
        fixes = [
            f"each step calls the model on one observation at a time (an RL episode, a "
            f"sequence fed token by token): {what} runs between those calls; batch them "
            "(step several environments at once with gymnasium.vector, pad several "
            "sequences into one batch) so that the model is called on a batch, or make "
            f"{what} cheaper",
            fixes[0],
        ]
    said = (
        f"{head}: {'mostly' if first.share >= 0.5 else 'the largest part'} in {what} "
        f"{'at' if direct else 'called at'} {first.site}{line}, {first.share:.0%} of "
        f"the samples taken after {_after(gap)}."
    )
    if direct:
        said += (
            " A direct .forward() call runs none of the module's hooks, so that time counts "
            "as other here, not as forward."
        )
    return [_finding(inputs, said, first.site, evidence, fixes)]


def _finding(
    inputs: Inputs, summary: str, location: str | None, evidence: Evidence, fix: list[str]
) -> Diagnosis:
    return Diagnosis(
        kind="unattributed_time",
        severity="info",
        step=int(inputs.column("step")[-1]),
        summary=summary,
        location=location,
        evidence=evidence,
        fix=fix,
        key="unattributed_time",
    )


def _largest_gap(inputs: Inputs) -> tuple[str, list[SampledFunction]] | None:
    """The gap the latest samples saw most of, and what its samples spent the time in."""
    for event in reversed(inputs.events_of("gap_samples")):
        gaps = event["data"].get("gaps") or {}
        ranked = sorted(gaps.items(), key=lambda item: -int(item[1].get("samples") or 0))
        for gap, seen in ranked:
            if seen.get("top"):
                return gap, [SampledFunction.from_json(t) for t in seen["top"]]
    return None


def _after(gap: str) -> str:
    return "the step began" if gap == "start" else f"the {gap} phase ended"
