"""The step in progress: everything gathered between two step boundaries, in one object that is
replaced whole when the step ends (nothing to reset by hand)."""

from __future__ import annotations

from typing import Any

from torchdoctor.store.schema import OPTIMIZER_STEPS, STEPS
from torchdoctor.telemetry.phases import PHASES

TAPE_LIMIT = 8  # root-module calls kept per step for a NaN replay

StepRow = STEPS.row_type()
OptimizerStepRow = OPTIMIZER_STEPS.row_type()


class StepState:
    __slots__ = (
        "autocast",
        "backward_site",
        "claimed",
        "clip_norm",
        "closure_losses",
        "grad_norm",
        "grad_norm_value",
        "loss_ref",
        "losses",
        "micro",
        "nonfinite_seen",
        "phases",
        "rng",
        "scaled",
        "skip",
        "start",
        "tape",
        "update",
    )

    def __init__(self, start: float | None) -> None:
        self.start = start  # None until the first step's first activity
        self.phases = dict.fromkeys(PHASES, 0.0)  # seconds per python.steps phase column
        self.losses: list[Any] = []  # losses backward() ran on outside optimizer.step()
        self.closure_losses: list[Any] = []  # ... inside it (an LBFGS closure)
        self.claimed = 0  # losses[:claimed] belong to another optimizer's step (a GAN)
        self.loss_ref: Any = None  # the tensor backward() ran on (its graph names the loss ops)
        self.backward_site: tuple[str, int] | None = None  # where backward() was called
        self.nonfinite_seen = False
        self.micro = 0  # backward() calls
        self.clip_norm: Any = None  # the norm clip_grad_norm_ returned (no need to recompute)
        self.grad_norm: Any = None  # the primary optimizer's total gradient norm (a tensor)
        self.grad_norm_value: float | None = None  # ... read back, when it was read at once
        self.skip = False  # --guard dropped this step's update
        self.scaled: tuple[Any, Any] | None = None  # (scaled loss, loss) from GradScaler.scale
        self.tape: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []  # model calls
        self.rng: Any = None  # CPU random state at the first model call (for a replay)
        self.autocast: list[tuple[str, Any]] = []  # autocast contexts at the first model call
        self.update: tuple[Any, float] | None = None  # (primary optimizer, seconds in its step())

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
