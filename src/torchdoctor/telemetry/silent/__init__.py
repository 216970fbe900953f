"""Silent-error checks at run time: training bugs that raise nothing and show, much later, only
as a model that learns badly (docs/silent-errors.md).

Each check measures a fact of the live process on a few sampled steps and writes it as an
event `silent.<check>`; a pure diagnosis module judges it (diagnose/<kind>.py). The Recorder
calls in here behind one test, `if silent.active`, true on the sampled steps only (pacing.py:
steps 1-3, the three after a late first update, then pairs of consecutive steps at least 50
apart, spread further when they would cost more than 1% of the training time). On the other steps
nothing runs but that test and, per model call, a read of `module.training` (a model called
in eval mode is looked at: see modes.py).

The checks, each the only writer of its state:
  grad_reset.py     gradients never cleared between two updates; cleared at every micro-batch
  update_effect.py  an optimizer.step() that leaves the weights unchanged
  loss_graph.py     the loss's autograd graph: detached from every parameter, divided for
                    gradient accumulation, the inputs of its loss functions, autocast's effect
  batches.py        the same batch twice, the batch dimension collapsed to 1
  modes.py          a model trained in eval mode, a train() override never called, dropout
                    that stays on in eval mode
  coverage.py       parameters with gradients that no optimizer holds, a model frozen but for
                    its normalization layers, learning rates per parameter group
  schedulers.py     a scheduler stepped before its optimizer, never stepped, or bound to an
                    optimizer that never steps
  inits.py          weights initialised again by the same line before the first update
                    (torch.nn.init's functions, wrapped; judged at the end of the first step
                    with an update)
  generation.py     Hugging Face generate() returning more than max_new_tokens new tokens
                    (wrapped once the script imports transformers' generation code)
The patches they need (nn.Module.train, the schedulers' step) are in hooks.py; inits.py and
generation.py install their own wrappers.

Nothing here reads a value back from a GPU before its time: device values go through the
Recorder's Readback (read once their copy has landed). No collective, ever.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from torchdoctor._failsafe import Switch
from torchdoctor.frames import site, user_frame
from torchdoctor.telemetry.silent.batches import Batches
from torchdoctor.telemetry.silent.coverage import Coverage
from torchdoctor.telemetry.silent.generation import Generations
from torchdoctor.telemetry.silent.grad_reset import GradientResets
from torchdoctor.telemetry.silent.inits import Initialisations
from torchdoctor.telemetry.silent.loss_graph import LossGraphs
from torchdoctor.telemetry.silent.modes import Modes
from torchdoctor.telemetry.silent.pacing import Pacing
from torchdoctor.telemetry.silent.schedulers import Schedulers
from torchdoctor.telemetry.silent.update_effect import UpdateEffects

if TYPE_CHECKING:
    from torchdoctor.telemetry.patches import Hooks
    from torchdoctor.telemetry.step import StepState


class SilentChecks:
    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.torch = rec.torch
        self.switch = Switch("silent-error checks")
        self.active = False  # the step in progress is sampled
        self.full = False  # ... and every check looks at it
        self.pacing = Pacing()  # which steps are sampled
        self.fetches = 0  # DataLoader fetches in the step in progress (sampled steps)
        # on_step_end(step) has nothing to do while step < quiet_until (the steps after it are
        # not sampled): the usual step pays one comparison
        self.quiet_until = 0
        self._emitted: set[Any] = set()
        self.facts: list[tuple[str, dict[str, Any]]] = []  # what was written, for the recipes
        self._param_ids: tuple[int, set[int]] = (-1, set())  # (step, ids) of optimizer params
        self.resets = GradientResets(self)
        self.updates = UpdateEffects(self)
        self.graphs = LossGraphs(self)
        self.batches = Batches(self)
        self.modes = Modes(self)
        self.coverage = Coverage(self)
        self.schedulers = Schedulers(self)
        self.inits = Initialisations(self)
        self.generations = Generations(self)

    def install(self, hooks: Hooks) -> None:
        from torchdoctor.telemetry.silent import hooks as patches

        patches.install(self, self.torch, hooks)
        self.inits.install(self.torch, hooks)
        self.generations.install(hooks)
        hooks.on_remove(self.remove)

    def remove(self) -> None:
        if self.switch.on:
            try:
                self.schedulers.summary(self.rec.step)
                self.inits.judge(self.rec.step)
            except Exception as exc:
                self.fail(exc)
        self.resets.remove()
        self.modes.remove()
        self.updates.remove()
        self.active = False

    # -- shared by the checks ----------------------------------------------------------------
    def emit(self, check: str, data: dict[str, Any], key: Any = None) -> bool:
        """Write the fact `silent.<check>` (once per `key`, when one is given)."""
        if key is not None:
            if (check, key) in self._emitted:
                return False
            self._emitted.add((check, key))
        self.rec.event(f"silent.{check}", data)
        if len(self.facts) < 1000:
            self.facts.append((check, data))
        return True

    def batches_repeat_on_purpose(self) -> None:
        """A recipe (overfit) feeds the same batch again: not a finding."""
        self.batches.on = False

    def param_ids(self) -> set[int]:
        """ids of the parameters every optimizer seen so far holds (once per step)."""
        step = self.rec.step
        if self._param_ids[0] != step:
            ids = {
                id(p)
                for opt in self.rec.optimizers.known()
                for group in opt.param_groups
                for p in group["params"]
            }
            self._param_ids = (step, ids)
        return self._param_ids[1]

    def label(self, optimizer: Any) -> str:
        return str(self.rec.optimizers.label(optimizer))

    def user_site(self) -> str | None:
        """file:line of the user's code that is running now (outside torch and torchdoctor)."""
        return site(user_frame(sys._getframe(2)))

    @property
    def usable(self) -> bool:
        """Checks run on eager code only: under torch.compile, hooks and graph walks would
        change what Dynamo sees."""
        return self.switch.on and not self.rec.compiled

    def fail(self, exc: BaseException) -> None:
        self.active = False
        self.switch.fail(exc)

    # -- from the Recorder (sampled steps) -----------------------------------------------------
    def on_data(self) -> None:
        self.fetches += 1

    def on_model_call(self, module: Any, args: Any, kwargs: Any) -> None:
        """Every model call while sampling; otherwise the calls of a model in eval mode."""
        if not self.usable:
            return
        try:
            if not module.training:
                self.modes.on_eval_call(module)
            if self.active:
                self.batches.on_model_call(module, args, kwargs)
                if self.full:
                    self.graphs.on_model_call(module)
        except Exception as exc:
            self.fail(exc)

    def on_backward(self, loss: Any) -> None:
        if not self.usable:
            return
        try:
            scaled = self.rec.state.scaled  # GradScaler: the loss before scaling
            if scaled is not None and loss is not None and scaled[0] is loss:
                loss = scaled[1]
            self.resets.on_backward()
            if self.full:
                self.modes.on_backward()
                self.graphs.on_backward(loss)
        except Exception as exc:
            self.fail(exc)

    def before_update(self, optimizer: Any) -> None:
        if not self.usable:
            return
        try:
            step = self.rec.step
            primary = optimizer is self.rec.optimizers.primary
            self.resets.before_update(optimizer, step, primary)
            if self.full:
                self.updates.before_update(optimizer, step)
                if primary:
                    self.graphs.before_update(step)
                    self.coverage.before_update(step)
        except Exception as exc:
            self.fail(exc)

    def after_update(self, optimizer: Any) -> None:
        if not self.usable:
            return
        try:
            step = self.rec.step
            self.updates.after_update(optimizer, step)
            self.resets.after_update(optimizer, step, self.pacing.sampled(step + 1))
        except Exception as exc:
            self.fail(exc)

    def on_step_end(self, state: StepState, step: int) -> None:
        """A step ended (the Recorder calls this before its step listeners): whether the next
        step is sampled; the sampled step's summaries."""
        if step < self.quiet_until:  # steady.cpp makes this test too, to spare the call
            return
        pacing = self.pacing
        if pacing.first_update is None and state.update is not None:
            pacing.first_update = step
            if self.switch.on:
                try:
                    self.inits.judge(step)
                except Exception as exc:
                    self.fail(exc)
        if self.active and self.switch.on:
            try:
                self.batches.step_ended(step, pacing.sampled(step + 1))
                self.schedulers.step_ended(step)
            except Exception as exc:
                self.fail(exc)
        pacing.step_ended(state, step, time.perf_counter())
        self.active = self.switch.on and pacing.sampled(step + 1)
        self.full = self.active and pacing.full(step + 1)
        self.fetches = 0
        if not self.switch.on:
            self.quiet_until = 1 << 62
        elif not self.active and pacing.first_update is not None:
            self.quiet_until = pacing.next_sampled(step + 1) - 1
