"""What happens at optimizer.step() (the global optimizer step pre/post hooks): the gradient
check before the update (its norm, its finiteness, --guard), the optimizer phase, and after
the update, for the primary optimizer, the end of the step; for any other optimizer, its row
of python.optimizer_steps. GradScaler's skipped steps end a step too (skipped).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.telemetry.gradient_check import Check, guard_update
from torchdoctor.telemetry.handover import Handover, Held

OPTIMIZER = "optimizer"  # the step mode (recorder.py) once the primary optimizer steps


class Updates:
    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.optimizers = rec.optimizers
        self.handover = Handover(rec)  # other optimizers' updates until it is known whose
        self.new_phase = False  # the update in progress made its optimizer the primary

    def begin(self, optimizer: Any, now: float) -> None:
        """optimizer.step() is called: check the gradients it is about to apply."""
        rec, optimizers = self.rec, self.optimizers
        primary = optimizers.primary
        if primary is None:  # the first optimizer that steps is the primary
            optimizers.adopt(optimizer)
            rec.training_thread_is_this_one()
            primary = optimizer
        if optimizers.note(optimizer, rec.steps_done) and optimizer is not primary:
            self._second_optimizer_seen()
        if optimizers.takes_over(optimizer):  # the primary's training ended, this one's began
            rec.event("primary_changed", {"optimizer": optimizers.label(optimizer)})
            self.handover.take_over(optimizer)  # (the event's step: where its phase began)
            self.new_phase = True
            primary = optimizer
        if rec.mode != OPTIMIZER and optimizer is primary:
            rec.enter_mode(OPTIMIZER)
        state = rec.state
        if state.start is None:
            state.start = now
        rec.timer.enter("optimizer", now, state.phases)
        if optimizer is primary:
            optimizers.closure_checked = False
            check = self.check_primary(optimizer)
        else:
            check = rec.gradients.of_optimizer(optimizer, None, rec.read_now())
            if rec.host.config.guard and guard_update(check):
                rec.event("guard_skip", {"optimizer": optimizers.label(optimizer)})
        optimizers.begin(optimizer, now, check)
        if rec.silent.active:
            rec.silent.before_update(optimizer)

    def end(self, optimizer: Any, now: float) -> None:
        """optimizer.step() returned: the primary's update ends the step."""
        rec = self.rec
        state = rec.state
        rec.timer.exit("optimizer", now, state.phases)
        if rec.silent.active:
            rec.silent.after_update(optimizer)
        if optimizer is not self.optimizers.primary:
            t0, check = self.optimizers.end(optimizer, now)
            self._other_row(optimizer, now - t0, check, now)
            return
        if rec.plan.tracing:
            rec.memory_row("optimizer")
        self.handover.flush()  # the others' updates since its last were in its iterations
        t0, _check = self.optimizers.end(optimizer, now)
        state.update = (optimizer, now - t0)
        rec.end_step(now, skipped=state.skip)
        if self.new_phase:  # its phase may train models not seen yet: the next step looks
            self.new_phase = False
            rec.rediscover(primary_too=False)

    def skipped(self, optimizer: Any, now: float) -> None:
        """GradScaler skipped optimizer.step() (inf/NaN gradients): still a step, skipped."""
        rec, optimizers = self.rec, self.optimizers
        if optimizers.primary is None:
            optimizers.adopt(optimizer)
        if optimizer is optimizers.primary:
            rec.enter_mode(OPTIMIZER)
            rec.end_step(now, skipped=True)

    def check_primary(self, optimizer: Any) -> Check:
        """The primary's gradient check (also for an LBFGS closure's first gradients)."""
        rec = self.rec
        check = rec.gradients.of_optimizer(optimizer, rec.state.clip_norm, rec.read_now())
        if rec.plan.tracing:
            rec.tracer.module_grads(optimizer, rec.models, rec.readback, rec.rank)
        rec.judge(check, guard=bool(rec.host.config.guard))
        return check

    def _other_row(self, optimizer: Any, seconds: float, check: Check | None, now: float) -> None:
        """Another optimizer's update (the backward() calls since the last update of any
        optimizer are its losses); its step is the iteration it belongs to (optimizers.py).
        Held until it is known whether it was (handover.py)."""
        rec = self.rec
        label, lag = self.optimizers.info(optimizer)
        guarded = check is not None and not check.finite and bool(rec.host.config.guard)
        update = Held(
            optimizer,
            max(0, rec.step - lag),
            label,
            rec.state.claim(),
            check,
            seconds,
            rec.lr(optimizer),
            guarded,
            now,
            dict(rec.state.phases),
        )
        self.handover.hold(update)

    def _second_optimizer_seen(self) -> None:
        """The run has several optimizers from now on: the primary's updates get rows of
        python.optimizer_steps too, starting with the step that ended before this was known."""
        primary = self.optimizers.primary
        if primary is not None and self.optimizers.several:
            rows = self.rec.rows
            rows.primary_update(rows.last, self.optimizers.label(primary), None)
