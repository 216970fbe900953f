"""`dataloader_bound`: a large share of step time spent waiting for the next batch, with the
loader's settings and the fixes in order."""

from __future__ import annotations

from typing import Any

import numpy as np

from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis

WARMUP = 3  # the first batches include worker start-up
WINDOW = 50
MIN_STEPS = 10
MIN_WAIT = 0.001  # seconds per step: below this, waiting cannot matter however large a share
INFO_SHARE = 0.3
WARNING_SHARE = 0.5


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    if inputs.steps.rows < WARMUP + MIN_STEPS:
        return []
    wait = inputs.column("data_wait")[WARMUP:][-WINDOW:]
    duration = inputs.column("duration")[WARMUP:][-WINDOW:]
    total = float(duration.sum())
    if total <= 0:
        return []
    share = float(wait.sum()) / total
    if share < INFO_SHARE or float(wait.mean()) < MIN_WAIT:
        return []
    loaders = inputs.events_of("dataloader")
    loader: dict[str, Any] = loaders[-1]["data"] if loaders else {}
    severity = "warning" if share >= WARNING_SHARE else "info"
    return [
        Diagnosis(
            kind="dataloader_bound",
            severity=severity,
            step=int(inputs.column("step")[-1]),
            summary=(
                f"{share:.0%} of step time is spent waiting for data "
                f"({float(wait.mean()) * 1e3:.1f} ms per step): the model is starved."
            ),
            evidence={
                "data_wait_share": share,
                "data_wait_per_step": float(wait.mean()),
                "step_time": float(np.median(duration)),
                "steps": int(wait.size),
                "loader": loader,
            },
            fix=fixes(loader, inputs.cpus),
            key="dataloader_bound",
        )
    ]


def fixes(loader: dict[str, Any], cpus: int | None) -> list[str]:
    """`cpus`: the recording machine's (None: unknown, then the advice does without)."""
    out = []
    workers = loader.get("num_workers")
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
    if not loader.get("pin_memory"):
        out.append("pin_memory=True, and .to(device, non_blocking=True) for the batch (on GPU)")
    if workers and not loader.get("persistent_workers"):
        out.append("persistent_workers=True: no worker start-up at every epoch")
    if workers:
        out.append(
            f"prefetch more: prefetch_factor={loader.get('prefetch_factor') or 2} now; try 4"
        )
    out.append(
        "move transforms out of __getitem__: batch them on the GPU, or pre-process the data "
        "set once and cache it on fast local storage"
    )
    return out
