"""The steady step: when a step may take the short paths, and the handlers that take them.

Most steps of a run are alike: the primary optimizer ends them, there is one optimizer, the
values are on the CPU, the step is neither traced nor sampled by the silent checks. At each
step's end the Recorder asks `after()` whether the next one is such a step and keeps the
answer in `Recorder.steady` (the primary's weak reference, or None). On a steady step the hooks
(torch_hooks.py) call the compiled handlers (native/steady.cpp: one call per torch event,
`Recorder.steady_handlers`), which do what the general path does, on the same objects, for the
ordinary event, and answer False for anything else: a loss that is not finite, a closure inside
optimizer.step(), a gradient the C++ sum cannot read, a rank poll due. The hook then calls the
general path (the Recorder's handlers), the only one that saw that event. The rows are the same
either way (tests/unit/test_steady_step.py runs each loop both ways).

Where the compiled module is not built there are no steady steps: every step takes the general
path (the same rows, at the Python cost; docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from torchdoctor import native
from torchdoctor.telemetry.gradients import NATIVE_MAX
from torchdoctor.telemetry.invisible import export_flags
from torchdoctor.telemetry.optimizers import learning_rate
from torchdoctor.telemetry.phases import zero
from torchdoctor.telemetry.step import TAPE_LIMIT, StepState, any_autocast, autocast_now
from torchdoctor.telemetry.step_rows import StepRow
from torchdoctor.telemetry.updates import OPTIMIZER  # the mode in which a step can be steady


@dataclasses.dataclass(frozen=True)
class Parts:
    """What the compiled handlers are handed, besides the Recorder: the Python they call or
    build, each from its one place."""

    row_type: type = StepRow  # python.steps' row (steady.cpp checks its columns)
    state_type: type = StepState  # the next step's state
    zero_phases: Any = zero  # a new step's phases dict (copied for each next StepState)
    after: Any = None  # whether the next step is steady (this module's after)
    learning_rate: Any = learning_rate  # a learning rate that is not a float
    autocast_now: Any = autocast_now  # the autocast contexts, where one is on
    any_autocast: Any = any_autocast  # torch's one test for any autocast (None: old torch)
    torch: Any = torch
    export_flags: Any = export_flags  # _is_compiling_flag: torch.export runs the model
    limit: int = NATIVE_MAX  # gradient elements summed in C++
    tape_limit: int = TAPE_LIMIT  # model calls kept for a NaN replay


def handlers(rec: Any) -> Any:
    """The compiled handlers for this Recorder (its parts made), or None where the module is
    not built or the phase timer is Python's."""
    kernels = native.load()
    if kernels is None or rec.timer.__class__ is not getattr(kernels, "PhaseTimer", None):
        return None
    return kernels.SteadyStep(rec, Parts(after=after))


def after(rec: Any) -> Any:
    """The primary optimizer's weak reference when the step beginning now may take the short
    paths, else None (read from the Recorder's parts; it writes nothing)."""
    plan = rec.plan
    if (
        rec.steady_handlers is None
        or rec.mode != OPTIMIZER
        or plan.tracing
        or plan.shaping
        or plan.hooks_on
        or plan.discovering
        or rec.silent.active
        or rec.rows.cuda
        or rec.optimizers.several
        or rec.roots.pending
        or not rec.roots.scanned
        or not rec.allow_steady
    ):
        return None
    return rec.optimizers.primary_ref
