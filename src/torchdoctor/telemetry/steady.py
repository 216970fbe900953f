"""The steady step: the short paths of the hot handlers, and when a step may take them.

Most steps of a run are alike: the primary optimizer ends them, there is one optimizer, the
values are on the CPU, the step is neither traced nor sampled by the silent checks. At each
step's end the Recorder asks `after()` whether the next one is such a step and keeps the
answer in `Recorder.steady` (the primary's weak reference, or None). On a steady step the hot
handlers (Recorder.on_backward and on_backward_done, Updates.begin and end) take a short path
at their top, and fall through to the general one at the first thing out of the ordinary: a
loss that is not finite, a closure inside optimizer.step(), a gradient the C++ sum cannot read.
The rows are the same either way (tests/unit/test_steady_step.py runs both ways).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.telemetry.updates import OPTIMIZER  # the mode in which a step can be steady


def after(rec: Any) -> Any:
    """The primary optimizer's weak reference when the step beginning now may take the short
    paths, else None (read from the Recorder's parts; it writes nothing)."""
    plan = rec.plan
    if (
        rec.mode != OPTIMIZER
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
