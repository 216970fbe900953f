"""The step in progress: everything gathered between two step boundaries, in one object that is
replaced whole when the step ends (nothing to reset by hand)."""

from __future__ import annotations

from typing import Any

import torch

from torchdoctor.native import scalar_value as _scalar
from torchdoctor.telemetry.phases import zero

TAPE_LIMIT = 8  # root-module calls kept per step for a NaN replay
any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)  # torch 2.4 on


class StepState:
    # What most steps never set is a class-level default: a new StepState every step costs
    # five attributes, not eighteen (the step's fixed cost; docs/benchmarks.md).
    claimed = 0  # losses[:claimed] belong to another optimizer's step (a GAN)
    loss_ref: Any = None  # the tensor backward() ran on (its graph names the loss ops)
    backward_site: tuple[str, int] | None = None  # where backward() was called
    nonfinite_seen = False
    micro = 0  # backward() calls
    clip_norm: Any = None  # the norm clip_grad_norm_ returned (no need to recompute)
    grad_norm: Any = None  # the primary optimizer's total gradient norm (a tensor)
    grad_norm_value: float | None = None  # ... read back, when it was read at once
    skip = False  # --guard dropped this step's update
    scaled: tuple[Any, Any] | None = None  # (scaled loss, loss) from GradScaler.scale
    rng: Any = None  # (generator, its state) at the first model call (for a replay)
    autocast: tuple[tuple[str, Any], ...] | list[tuple[str, Any]] = ()  # at the first call
    update: tuple[Any, float] | None = None  # (primary optimizer, seconds in its step())
    grad_enabled: bool | None = None  # grad mode at the step's first model call

    def __init__(self, start: float | None) -> None:
        # native/steady.cpp's new_state makes the same five attributes without this call
        # (test_steady_step.py compares the two)
        self.start = start  # None until the first step's first activity
        self.phases = zero()  # seconds per python.steps phase column
        self.losses: list[Any] = []  # losses backward() ran on outside optimizer.step()
        self.closure_losses: list[Any] = []  # ... inside it (an LBFGS closure)
        self.tape: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []  # model calls

    def keep_call(self, module: Any, args: Any, kwargs: Any, torch: Any, generator: Any) -> None:
        """A model call of this step, kept for a NaN replay; the first with the state of the
        generator its dropout draws from (None: the models draw no random numbers) and the
        autocast contexts it ran in."""
        tape = self.tape
        if not tape:
            if generator is not None:
                self.rng = (generator, generator.get_state())
            self.autocast = autocast_now(torch)
            self.grad_enabled = torch.is_grad_enabled()  # a crash in backward asks
        if len(tape) < TAPE_LIMIT:
            tape.append((module, args, kwargs))

    def note_loss(
        self, loss: Any, site: tuple[str, int] | None, on_device: bool, closure: bool
    ) -> None:
        """A loss backward() runs on: its value now (CPU) or as a tensor read back later
        (CUDA); `closure`: inside optimizer.step() (an LBFGS closure)."""
        scaled = self.scaled
        if scaled is not None and scaled[0] is loss:  # GradScaler: the unscaled loss
            loss = scaled[1]
        self.loss_ref = loss
        self.backward_site = site
        if on_device:
            value = loss.detach()
        else:
            value = _scalar(loss)  # read in place (C++), else .item()
            if value is None:
                value = loss.item()
        (self.closure_losses if closure else self.losses).append(value)

    def step_losses(self) -> list[Any]:
        """The losses this step reports: those of the primary optimizer's backward() calls,
        and of the first closure evaluation inside its step() (LBFGS evaluates the closure
        several times: the first is the loss before its update; a trainer that accumulates
        gradients runs the last micro-batch's closure inside step())."""
        return self.losses[self.claimed :] + self.closure_losses[:1]

    def claim(self) -> list[Any]:
        """Another optimizer's step takes the losses backward() ran on since the last claim."""
        out = self.losses[self.claimed :] + self.closure_losses[:1]
        self.claimed = len(self.losses)
        self.closure_losses = []
        return out

    def absorb(self, later: StepState) -> StepState:
        """Fold a state split off too early (a micro-batch after all) back into this one."""
        for name, seconds in later.phases.items():
            self.phases[name] += seconds
        self.losses.extend(later.losses)
        self.closure_losses.extend(later.closure_losses)
        self.micro += later.micro
        self.nonfinite_seen = self.nonfinite_seen or later.nonfinite_seen
        self.tape.extend(later.tape[: max(0, TAPE_LIMIT - len(self.tape))])
        for name in ("loss_ref", "backward_site", "clip_norm", "grad_norm", "scaled"):
            value = getattr(later, name)
            if value is not None:
                setattr(self, name, value)
        if later.grad_norm_value is not None:
            self.grad_norm_value = later.grad_norm_value
        return self

    def ran_on_cuda(self, torch: Any, models: Any) -> bool:
        """This step ran on a GPU: its loss is there, or its models' parameters are (a loss
        moved to the CPU before backward() still means device values to read back); with
        neither a loss nor a model seen, the process's CUDA is the best guess."""
        loss = self.loss_ref
        if isinstance(loss, torch.Tensor) and loss.is_cuda:
            return True
        for model, _label in models.roots():
            for p in model.parameters():
                return bool(p.is_cuda)
        return not isinstance(loss, torch.Tensor)


def autocast_now(torch: Any) -> list[tuple[str, Any]]:
    any_enabled = any_autocast
    if any_enabled is not None and not any_enabled():  # the common case: one call
        return []
    out = []
    for device in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device):
                out.append((device, torch.get_autocast_dtype(device)))
        except (TypeError, RuntimeError, AttributeError):  # torch without per-device autocast
            continue
    return out
