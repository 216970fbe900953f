"""Parts of evidence that several kinds share, as records (_json.Record: written to the
finding's JSON and read back as these classes). A part one kind alone has sits in its module;
a captured stack's frames and threads are frames.StackFrame and frames.ThreadStack."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor._json import Record, optional


@dataclasses.dataclass(kw_only=True)
class CollectiveCall(Record):
    """A collective call as a finding shows it; the optional fields where the finding has
    them (a pending call's group and number, how long it has been waited for)."""

    group: str | None = optional()
    seq: int | None = optional()
    op: str
    shapes: Any = None  # the tensors' shapes: parsed JSON, or the text as recorded
    dtype: str | None = None
    site: str | None = None  # file:line of the user's code that issued it
    step: int | None = None
    state: str | None = optional()  # issued, completed or failed
    waited: float | None = optional()  # seconds a rank has waited in it


@dataclasses.dataclass(kw_only=True)
class SampledFunction(Record):
    """A function the stack samples of the time outside the phases fell in (the gap sampler's,
    telemetry/gap_sampler.py): the loop's line that calls it and its share of the samples;
    for the loop's own input function, its share of each gap and since which step it is known.
    Named by `dataloader_bound` and `unattributed_time`."""

    function: str | None
    site: str  # file:line of the loop's call
    code: str | None  # that line's source
    share: float  # of the gap's samples
    steps: float  # share of the sampled steps it ran in
    file: str | None = optional()  # where the function is defined
    line: int | None = optional()
    gaps: dict[str, float] | None = optional()  # the input function: gap -> its share
    of_other: float | None = optional()  # ... of all the time outside the phases
    from_step: int | None = optional()  # ... found at this step (its time was `other` before)


@dataclasses.dataclass(kw_only=True)
class LoaderFacts(Record):
    """A DataLoader as the `dataloader` event tells it (telemetry/torch_hooks.py); None where
    the run did not say (no DataLoader seen)."""

    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    batch_size: int | None = None
    dataset: str | None = None  # its class name
    batches: int | None = None  # per epoch, where the loader knows
