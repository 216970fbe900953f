"""`same_batches`: every rank of a data-parallel job trains on the same batches. DDP averages
the ranks' gradients, so N ranks that read the same data do the work of one: the DataLoader
has no DistributedSampler (each rank reads the whole dataset in the same order), or each rank
seeds the same shuffle itself.

Each rank fingerprints its model's inputs on its sampled steps (telemetry/silent/batches.py)
and writes a short digest per step in its `silent.batches` facts; the digests are compared
here, live from what the ranks tell each other (cluster/) or from the rank directories
afterwards. Judged only where the ranks replicate a DDP model (they write replica checksums,
telemetry/replicas.py): ranks of a tensor-parallel group read the same batch on purpose.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs, RankBatches, event_data
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site
from torchdoctor.identity import ranks_text

JOB = True  # compares ranks: runs on a job's tables

EVENT = "silent.batches"  # python.events kind whose data carries "steps" and "digests"
LOADER = "dataloader"  # python.events kind: a DataLoader's facts (its sampler, its loop)
MIN_STEPS = 2  # sampled steps seen on every rank, all alike, before it is said
RECENT = 16  # steps per rank kept and sent


@kind("same_batches")
@dataclasses.dataclass(kw_only=True)
class SameBatchesEvidence(Evidence):
    ranks: list[int]
    steps: list[int]  # the sampled steps compared: the same batch on every rank at each
    sampler: str | None = None  # the class of rank 0's DataLoader's sampler


def batches_of(records: list[dict[str, Any]]) -> RankBatches:
    """A rank's batch digests (its last RECENT steps) and first DataLoader, from python.events
    records (data decoded or not)."""
    out = RankBatches()
    for record in records:
        data = event_data(record) if record.get("kind") in (EVENT, LOADER) else None
        if data is None:
            continue
        if record.get("kind") == LOADER:
            out.loader = out.loader or data
            continue
        for step, digest in zip(data.get("steps") or [], data.get("digests") or [], strict=False):
            if isinstance(step, int) and isinstance(digest, str):
                out.digests[step] = digest
    out.digests = dict(sorted(out.digests.items())[-RECENT:])
    return out


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    job = inputs.job
    if job is None:
        return []
    # data parallel: the ranks replicate a DDP model (their replica checksums)
    views = {r: v.batches for r, v in job.ranks.items() if v.batches.digests and v.checksums}
    have = {r: b.digests for r, b in views.items()}
    if len(have) < 2:
        return []
    common = set.intersection(*(set(b) for b in have.values()))
    steps = sorted(common)
    if len(steps) < MIN_STEPS:
        return []
    if any(len({b[step] for b in have.values()}) > 1 for step in steps):
        return []
    ranks = sorted(have)
    loader = views[ranks[0]].loader
    sampler, where = loader.get("sampler"), short_site(loader.get("site"))
    said = (
        f"its DataLoader (first iterated at {where}) samples with {sampler}, not a "
        "DistributedSampler"
        if sampler and where
        else "the DataLoader has no DistributedSampler"
    )
    return [
        Diagnosis(
            kind="same_batches",
            severity="warning",
            step=steps[-1],
            location=where,
            summary=(
                f"Every rank trains on the same batches: {ranks_text(ranks)} were given "
                f"identical inputs on each of the {len(steps)} sampled steps compared "
                f"({', '.join(str(s) for s in steps[:6])}). DDP averages their gradients, so "
                f"{len(ranks)} ranks do the work of one: {said}, or every rank shuffles with "
                "the same seed."
            ),
            evidence=SameBatchesEvidence(ranks=ranks, steps=steps, sampler=sampler),
            fix=[
                "give the DataLoader a DistributedSampler (sampler=DistributedSampler(dataset), "
                "shuffle=False) and call sampler.set_epoch(epoch) at each epoch",
                "a sampler of your own: give each rank its own shard (indices[rank::world_size])",
            ],
            key="same_batches",
        )
    ]
