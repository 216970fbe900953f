"""`repeated_batch`: the model is given the same batch again: on every sampled step (a batch
taken once before the loop, a dataset that returns one item), or the same batch from two
DataLoader workers (each holds a copy of the same random generator, so their random batches
or augmentations are the same).

Seen live (telemetry/silent/batches.py): fingerprints of the first model calls' tensors on
consecutive sampled steps; whether a DataLoader fetch happened in each step. Judged only where
a DataLoader is in use: an RL loop's rollouts may start from the same observation every
time, on purpose.
"""

from __future__ import annotations

import dataclasses

from torchdoctor._json import Record
from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis


@dataclasses.dataclass(kw_only=True)
class BatchWindow(Record):
    """A window of consecutive sampled steps (telemetry/silent/batches.py): the steps, the
    pairs whose batches were equal, whether a DataLoader fetch came before each, the last
    batch's shapes, each batch's leading dimensions and the model."""

    steps: list[int] = dataclasses.field(default_factory=list)
    same: list[list[int]] = dataclasses.field(default_factory=list)
    fetched: list[bool] = dataclasses.field(default_factory=list)
    shapes: list[list[int]] = dataclasses.field(default_factory=list)
    lead: list[list[int | None]] = dataclasses.field(default_factory=list)
    model: str = "the model"


@kind("repeated_batch")
@dataclasses.dataclass(kw_only=True)
class RepeatedBatchEvidence(Evidence):
    windows: list[BatchWindow] | None = optional()  # the windows that repeat (a whole batch)
    same: list[list[int]] | None = optional()  # pairs of steps whose batches were equal
    num_workers: int | None = optional()
    shapes: list[list[int]] | None = None


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    windows = [BatchWindow.from_json(e["data"]) for e in inputs.events_of("silent.batches")]
    loaders = [e["data"] for e in inputs.events_of("dataloader")]
    if not windows or not loaders:
        return []  # no DataLoader (RL rollouts, batches made by hand): repeats can be right
    pairs = sum(len(w.steps) - 1 for w in windows)
    consecutive = [p for w in windows for p in w.same if p[1] - p[0] == 1]
    every = pairs >= 2 and len(consecutive) >= pairs
    workers = max((int(x.get("num_workers") or 0) for x in loaders), default=0)
    last = windows[-1]
    model = last.model
    if every:
        fetched = any(f for w in windows for f in w.fetched)
        return [_every(model, last, windows, fetched, pairs)]
    same = [p for w in windows for p in w.same]
    if len(same) >= 1 and workers >= 2:
        return [_workers(model, same, workers, last)]
    return []


def _every(
    model: str, last: BatchWindow, windows: list[BatchWindow], fetched: bool, pairs: int
) -> Diagnosis:
    if fetched:
        cause = (
            "a batch is fetched every step, yet it is the same one: the dataset returns the "
            "same item, or the sampler the same indices"
        )
        fixes = [
            "check the Dataset's __getitem__ (does it use its index?) and the sampler",
        ]
    else:
        cause = (
            "no DataLoader fetch happens between steps: the batch is taken once (before the "
            "loop) and reused"
        )
        fixes = ["fetch a new batch inside the loop: for x, y in loader: ..."]
    fixes.append("ignore this if it is an overfit-one-batch sanity check")
    return Diagnosis(
        kind="repeated_batch",
        severity="warning",
        step=_established(windows),
        location=model,
        summary=(
            f"{model} gets the same batch every step (identical on all {pairs} pairs of "
            f"consecutive sampled steps): {cause}."
        ),
        evidence=RepeatedBatchEvidence(windows=windows, shapes=last.shapes),
        fix=fixes,
        key="repeated_batch",
    )


def _established(windows: list[BatchWindow]) -> int | None:
    """The last step of the window by which two pairs of consecutive steps were seen alike."""
    pairs = 0
    for w in windows:
        pairs += len(w.steps) - 1
        if pairs >= 2 and w.steps:
            return int(w.steps[-1])
    return None


def _workers(model: str, same: list[list[int]], workers: int, last: BatchWindow) -> Diagnosis:
    a, b = same[0]
    return Diagnosis(
        kind="repeated_batch",
        severity="warning",
        step=b,
        location=model,
        summary=(
            f"{model} got identical batches at steps {a} and {b} with {workers} DataLoader "
            "workers: each worker holds a copy of the same random generator, so their random "
            "samples or augmentations repeat, worker after worker."
        ),
        evidence=RepeatedBatchEvidence(same=same, num_workers=workers, shapes=last.shapes),
        fix=[
            "seed each worker: DataLoader(..., worker_init_fn=lambda i: "
            "np.random.seed(torch.initial_seed() % 2**32)), or draw random numbers with "
            "torch's generator inside __getitem__",
            "do not create a random generator in the Dataset's __init__ (every worker copies it)",
        ],
        key="repeated_batch",
    )
