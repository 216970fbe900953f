"""Appending the rows of python.steps and python.optimizer_steps.

On CPU a row is appended when its step ends, its loss and gradient norm already read. On CUDA
they are still on the device: they are copied back asynchronously (telemetry/readback.py) and
the row waits until they have landed, a step or two later, so nothing waits for the device.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchdoctor.store.schema import OPTIMIZER_STEPS, STEPS

if TYPE_CHECKING:
    from torchdoctor.store.tables import Tables
    from torchdoctor.telemetry.step import StepState

StepRow = STEPS.row_type()
_new_row = tuple.__new__


@dataclasses.dataclass(frozen=True)
class StepHeadline:
    """The latest step's headline numbers (the status line, the endpoint's status, eval's
    wait for a step boundary)."""

    step: int
    time: float  # when it ended (Unix seconds)
    duration: float
    data_wait: float
    loss: float | None
    allocated: int


OptimizerStepRow = OPTIMIZER_STEPS.row_type()

# late_nonfinite(step, grad_norm, loss): a CUDA step's values, read back, were not finite
LateNonFinite = Callable[[int, float | None, float | None], None]


class StepRows:
    def __init__(self, torch: Any, tables: Tables, readback: Any, late: LateNonFinite) -> None:
        self.torch = torch
        self.steps = tables["steps"]
        self.updates = tables["optimizer_steps"]
        self.readback = readback
        self.late = late
        self.cuda = False  # the values are on a GPU (set once the first step has run)
        self.last: Any = None  # the latest python.steps row appended
        self._nan: dict[Any, Any] = {}  # device -> a NaN scalar there (a value not known)

    def step(
        self,
        step: int,
        state: StepState,
        end: float,
        flags: tuple[bool, bool, int],
        memory: tuple[int, int, int, int],
        lr: float | None,
        primary: str | None,
    ) -> None:
        """The python.steps row of `step` (its StepState, ended at `end`; `flags`: skipped,
        traced, rank), and the primary optimizer's python.optimizer_steps row when the run has
        several (`primary`: its name)."""
        # Phases as measured while the step ran, the loss and gradient norm read now (CPU) or
        # later (CUDA: `norm` is then the gradient norm's tensor).
        skipped, traced, rank = flags
        duration = max(0.0, end - (state.start if state.start is not None else end))
        phases = state.phases
        losses = state.losses if not (state.claimed or state.closure_losses) else None
        if losses is None:
            losses = state.step_losses()
        row = _new_row(  # a StepRow without the named tuple's __new__ (a frame a step)
            StepRow,
            (
                step,
                time.time(),
                duration,
                phases["data_wait"],
                phases["forward"],
                phases["backward"],
                phases["optimizer"],
                max(0.0, duration - sum(phases.values())),  # other: what no phase claims
                sum(losses) / len(losses) if losses and not self.cuda else None,
                state.grad_norm_value,
                lr,
                *memory,  # allocated, peak, reserved, rss
                rank,
                state.micro,
                skipped,
                traced,
                phases["evaluation"],
            ),
        )
        norm = state.grad_norm if state.grad_norm_value is None else None
        update = state.update
        seconds = update[1] if update else None
        update_row = _update_of(row, primary, seconds) if primary is not None else None
        if not self.cuda:
            self.steps.append(row)
            self.last = row
            if update_row is not None:
                self.updates.append(update_row)
            return

        def done(loss: float | None, grad_norm: float | None) -> None:
            filled = row._replace(loss=loss, grad_norm=grad_norm)
            self.steps.append(filled)
            self.last = filled
            if update_row is not None:
                self.updates.append(update_row._replace(loss=loss, grad_norm=grad_norm))
            bad_loss = loss is not None and not math.isfinite(loss)
            if bad_loss or (grad_norm is not None and not math.isfinite(grad_norm)):
                self.late(row.step, grad_norm, loss)

        self._read_back(row.grad_norm, losses, norm, done)

    def primary_update(self, row: Any, label: str, seconds: float | None) -> None:
        """The primary's python.optimizer_steps row of a step already written (the row of the
        step before a second optimizer was seen)."""
        if row is not None:
            self.updates.append(_update_of(row, label, seconds))

    def other_update(
        self,
        step: int,
        label: str,
        losses: list[Any],
        check: Any,
        seconds_lr: tuple[float, float | None],
        guarded: bool,
        rank: int,
    ) -> None:
        """Another optimizer's python.optimizer_steps row."""
        seconds, lr = seconds_lr
        row = OptimizerStepRow(
            step,
            label,
            False,
            None if self.cuda else (sum(losses) / len(losses) if losses else None),
            check.value if check is not None else None,
            lr,
            seconds,
            guarded,
            time.time(),
            rank,
        )
        norm = check.norm if check is not None and check.value is None else None
        if not self.cuda:
            self.updates.append(row)
            return
        self._read_back(
            row.grad_norm,
            losses,
            norm,
            lambda loss, grad_norm: self.updates.append(
                row._replace(loss=loss, grad_norm=grad_norm)
            ),
        )

    @property
    def headline(self) -> StepHeadline | None:
        """The latest step row's headline numbers; None before the first step ends."""
        row = self.last
        if row is None:
            return None
        return StepHeadline(
            step=row.step,
            time=row.time,
            duration=row.duration,
            data_wait=row.data_wait,
            loss=row.loss,
            allocated=row.allocated,
        )

    def _read_back(
        self,
        known_norm: float | None,
        losses: list[Any],
        norm: Any,
        done: Callable[[float | None, float | None], None],
    ) -> None:
        # Few ops: on a launch-bound GPU step each one costs about as much host time as a
        # layer's (stack promotes the dtypes; a missing value is a NaN made once per device).
        torch = self.torch
        device = torch.device("cuda", torch.cuda.current_device())
        nan = self._nan.get(device)
        if nan is None:
            nan = self._nan[device] = torch.full((), float("nan"), device=device)
        tensors = [torch.as_tensor(v, device=device).reshape(()) for v in losses]
        loss = (
            (tensors[0] if len(tensors) == 1 else torch.stack(tensors).mean()) if tensors else nan
        )
        value = torch.as_tensor(norm).reshape(()).to(device) if norm is not None else nan
        has_loss, has_norm = bool(losses), norm is not None

        def landed(values: list[float]) -> None:
            loss_value, norm_value = values
            done(loss_value if has_loss else None, norm_value if has_norm else known_norm)

        def lost() -> None:  # the context broke first: the row without the values
            done(None, known_norm)

        self.readback.submit(torch.stack([loss, value]), landed, lost)
        self.readback.poll()


def _update_of(row: Any, label: str, seconds: float | None) -> Any:
    """The primary's python.optimizer_steps row, from its python.steps row (`seconds` None:
    its time in step() is the row's optimizer phase)."""
    return OptimizerStepRow(
        row.step,
        label,
        True,
        row.loss,
        row.grad_norm,
        row.lr,
        row.optimizer if seconds is None else seconds,
        row.skipped,
        row.time,
        row.rank,
    )
