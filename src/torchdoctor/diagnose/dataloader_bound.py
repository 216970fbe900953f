"""`dataloader_bound`: a large share of step time spent waiting for the next batch, with the
loader's settings and the fixes in order.

The wait is a DataLoader's `__next__`, or the loop's own input function (`get_batch` over
memory-mapped shards, a generator that slices tensors) that stack samples found in the gaps
between phases (telemetry/gap_sampler.py: its time is data_wait from the step it was found,
and the `gap_samples` event names it). With such a function, the finding is at the loop's line
that calls it, names it, and its fixes are for a loop that feeds itself."""

from __future__ import annotations

import dataclasses

import numpy as np

from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.parts import LoaderFacts, SampledFunction
from torchdoctor.diagnose.record import Diagnosis

# Its findings describe the run as it stands (the share over the recent steps):
# one it no longer returns has stopped being true, and the doctor marks it resolved.
RESOLVES = True

WARMUP = 3  # the first batches include worker start-up
WINDOW = 50
MIN_STEPS = 10
MIN_WAIT = 0.001  # seconds per step: below this, waiting cannot matter however large a share
INFO_SHARE = 0.3
WARNING_SHARE = 0.5


@kind("dataloader_bound")
@dataclasses.dataclass(kw_only=True)
class DataloaderBoundEvidence(Evidence):
    data_wait_share: float
    data_wait_per_step: float
    step_time: float
    steps: int
    loader: LoaderFacts
    input_function: SampledFunction | None = optional()  # the loop's own batch fetching


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    if inputs.steps.rows < WARMUP + MIN_STEPS:
        return []
    wait = inputs.column("data_wait")[WARMUP:][-WINDOW:]
    duration = inputs.column("duration")[WARMUP:][-WINDOW:]
    total = float(duration.sum())
    if total <= 0:
        return []
    found = input_function(inputs)
    if found is not None and found.from_step is not None:
        wait = _before_found(inputs, wait, found)
    share = float(wait.sum()) / total
    if share < INFO_SHARE or float(wait.mean()) < MIN_WAIT or not _held(wait, duration):
        return []
    loaders = inputs.events_of("dataloader")
    loader = LoaderFacts.from_json(loaders[-1]["data"]) if loaders else LoaderFacts()
    severity = "warning" if share >= WARNING_SHARE else "info"
    summary = (
        f"{share:.0%} of step time is spent waiting for data "
        f"({float(wait.mean()) * 1e3:.1f} ms per step): the model is starved."
    )
    evidence = DataloaderBoundEvidence(
        data_wait_share=share,
        data_wait_per_step=float(wait.mean()),
        step_time=float(np.median(duration)),
        steps=int(wait.size),
        loader=loader,
    )
    location = None
    if found is not None:
        line = f" (`{found.code}`)" if found.code else ""
        summary = (
            f"{share:.0%} of step time is spent waiting for data "
            f"({float(wait.mean()) * 1e3:.1f} ms per step), in {found.function}() called "
            f"at {found.site}{line}: the loop fetches its own batches, not through a "
            "DataLoader, and the model waits while it does."
        )
        evidence.input_function = found
        location = found.site
    return [
        Diagnosis(
            kind="dataloader_bound",
            severity=severity,
            step=int(inputs.column("step")[-1]),
            summary=summary,
            location=location,
            evidence=evidence,
            fix=fixes(loader, inputs.cpus) if found is None else input_fixes(found, inputs.cpus),
            key="dataloader_bound",
        )
    ]


def _held(wait: np.ndarray, duration: np.ndarray) -> bool:
    """Whether the wait's share holds in both halves of the window: a loader that starves the
    model does so steadily (or at every few batches), while one long pause (the process
    preempted on a busy machine, a collection of garbage) lands in one half alone."""
    half = wait.size // 2
    return all(
        float(d.sum()) > 0 and float(w.sum()) / float(d.sum()) >= INFO_SHARE
        for w, d in ((wait[:half], duration[:half]), (wait[half:], duration[half:]))
    )


def _before_found(inputs: Inputs, wait: np.ndarray, found: SampledFunction) -> np.ndarray:
    """The window's data wait with the steps before the input function was found counted as
    they are after it: its share of the time no phase claimed (`other`), where the rows booked
    its time (a short run: a few slow fetches before the samples, a few after). The share is
    of all the gaps' samples (`of_other`), not only of the gaps it runs in: other work of the
    loop (a metrics call) stays in `other`. (Runs recorded before `of_other`: the largest share
    of a gap.)"""
    steps = inputs.column("step")[WARMUP:][-WINDOW:]
    other = inputs.column("other")[WARMUP:][-WINDOW:]
    share = found.of_other
    if share is None:
        share = max((float(v) for v in (found.gaps or {}).values()), default=0.0)
    before = steps <= int(found.from_step or 0)
    return np.where(before, wait + np.nan_to_num(other) * share, wait)


def input_function(inputs: Inputs) -> SampledFunction | None:
    """The loop's own input function, as the latest stack samples found it (None when they
    found none, or were never taken)."""
    for event in reversed(inputs.events_of("gap_samples")):
        found = event["data"].get("input")
        if found:
            return SampledFunction.from_json(found)
    return None


def input_fixes(found: SampledFunction, cpus: int | None) -> list[str]:
    """`cpus`: the recording machine's (None: unknown, then the advice does without)."""
    name = found.function
    defined = f" ({found.file}:{found.line})" if found.file else ""
    workers = f"num_workers={min(8, max(2, cpus - 1))}" if cpus else "num_workers=N"
    return [
        f"fetch the next batch while the model trains: wrap {name}(){defined} in an "
        f"IterableDataset and iterate a DataLoader(..., {workers}, pin_memory=True) over it, "
        "or run it in a background thread that fills a queue of a few batches",
        f"make {name}() cheaper: open memory-mapped files once rather than per batch, index a "
        "whole batch at once rather than slice by slice in Python, and convert without copies "
        "(torch.from_numpy)",
        "on a GPU: pin the batch (x.pin_memory()) and copy it with .to(device, "
        "non_blocking=True), so the copy overlaps the step",
    ]


def fixes(loader: LoaderFacts, cpus: int | None) -> list[str]:
    """`cpus`: the recording machine's (None: unknown, then the advice does without)."""
    out = []
    workers = loader.num_workers
    if not workers:
        if cpus:
            out.append(
                f"load in parallel: DataLoader(..., num_workers={min(8, max(2, cpus - 1))}) "
                f"(the machine that ran it has {cpus} CPUs; about 4 per GPU is a common start)"
            )
        else:
            out.append(
                "load in parallel: DataLoader(..., num_workers=N), N up to the machine's CPUs "
                "less one (about 4 per GPU is a common start)"
            )
    elif cpus:
        out.append(f"more workers: num_workers={workers} now; try {min(cpus, workers * 2)}")
    else:
        out.append(f"more workers: num_workers={workers} now; try {workers * 2} if CPUs allow")
    if not loader.pin_memory:
        out.append("pin_memory=True, and .to(device, non_blocking=True) for the batch (on GPU)")
    if workers and not loader.persistent_workers:
        out.append("persistent_workers=True: no worker start-up at every epoch")
    if workers:
        out.append(f"prefetch more: prefetch_factor={loader.prefetch_factor or 2} now; try 4")
    out.append(
        "move transforms out of __getitem__: batch them on the GPU, or pre-process the data "
        "set once and cache it on fast local storage"
    )
    return out
