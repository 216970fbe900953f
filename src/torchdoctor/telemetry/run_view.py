"""What the rest of torchdoctor may read of a run in progress (views.TrainingView), and the
few requests it may make of it; the Recorder (recorder.py) is one. Readers are on other
threads than the training one: every member is safe to read at any time (a value may be one
step old). Nothing here changes how steps are recorded.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

from torchdoctor.telemetry.graph_walk import edges
from torchdoctor.telemetry.local_shards import largest_values
from torchdoctor.telemetry.optimizers import learning_rate
from torchdoctor.telemetry.step_rows import StepHeadline
from torchdoctor.views import ModuleCall

if TYPE_CHECKING:
    from torchdoctor.store.tables import Tables
    from torchdoctor.telemetry.step import StepState


class Host(Protocol):
    """What the Recorder needs from the process it records."""

    tables: Tables
    config: Any  # config.Config, read live (trace_every and guard change on a running probe)

    def on_cuda_detected(self) -> None: ...
    def on_first_step(self) -> None: ...  # again after a rediscovery


class RunView:
    # What the Recorder holds (recorder.py): the parts these read.
    timer: Any
    optimizers: Any
    rows: Any
    plan: Any
    nonfinite: Any
    tracer: Any
    shapes: Any
    state: StepState
    switch: Any
    collective_calls: Any
    gaps: Any
    steps_done: int
    rank: int
    mode: str
    models: Any
    tables: Tables
    readback: Any

    @property
    def phase(self) -> str:
        """What the training thread runs now: data, forward, backward, optimizer or other."""
        return self.timer.phase

    @property
    def primary(self) -> Any:
        return self.optimizers.primary

    def lr(self, optimizer: Any = None) -> float | None:
        return learning_rate(optimizer if optimizer is not None else self.optimizers.primary)

    @property
    def last(self) -> StepHeadline | None:
        return self.rows.headline

    def status(self) -> dict[str, Any]:
        last = self.last
        return {
            "step": self.steps_done,
            "last_step": last.step if last is not None else None,
            "loss": last.loss if last is not None else None,
            "step_time": last.duration if last is not None else None,
            "rank": self.rank,
            "hooks_on": self.switch.on,
            "step_mode": self.mode,
        }

    @property
    def tracing(self) -> bool:
        return self.plan.tracing

    def request_trace(self) -> None:
        """Trace the next step (a diagnosis wants per-module detail now)."""
        self.plan.requested = True

    def request_gap_samples(self) -> bool:
        """Sample the training thread's stack while no phase is open, for a short window (the
        step spends much outside every phase: its input may come from the loop's own code)."""
        return bool(self.gaps.request())

    def arm_sync_check(self) -> None:
        """CUDA: read the gradient norm before each update from now on (a NaN was seen late:
        the next one must be caught before its update, to be replayed)."""
        self.nonfinite.sync_check = True

    def settle_collectives(self) -> None:
        if self.collective_calls is not None:
            self.collective_calls.poll()  # thread-safe

    def model_inputs(self) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
        return list(self.state.tape)

    def last_traced_backward(self) -> str | None:
        return self.tracer.last_backward()

    def module_calls(self) -> tuple[int | None, list[ModuleCall], bool]:
        return self.shapes.flow()

    def forward_facts(self) -> dict[str, Any]:
        """What the step in progress did in its forward, for an error's causes: grad mode at
        its first model call (None: no model call seen), the parameters that train, and
        whether a model checkpoints its activations (Hugging Face's flag); and the losses of
        the steps so far, the learning rate and the weights that are not finite (a run that
        diverged before the error; read on a crash only); which op fed which in the loss's
        graph nearest it, and how many values were still on the GPU, unread (what a broken GPU
        context leaves to go on)."""
        models = [m for m, _label in self.models.models()]
        trainable = sum(1 for m in models for p in m.parameters() if p.requires_grad)
        checkpointing = any(getattr(m, "is_gradient_checkpointing", False) for m in models)
        try:
            nonfinite, largest = _weight_extremes(self.models, models)
        except Exception:  # a GPU context a device-side assert broke: no kernel runs any more
            nonfinite, largest = [], 0.0
        steps = self.tables["steps"].snapshot()
        losses = [float(v) for v in steps.data["loss"][-200:]] if steps.rows else []
        return {
            "grad_enabled": self.state.grad_enabled if self.state.tape else None,
            "trainable": trainable,
            "frozen_modules": _frozen_modules(models) if trainable else [],
            "models": len(models),
            "checkpointing": bool(checkpointing),
            "losses": losses,
            "lr": self.lr(),
            "nonfinite_weights": [".".join(n) for n in nonfinite[:5]],
            "largest_weight": largest,
            "embeddings": _embeddings(models),
            "loss_edges": edges(self.state.loss_ref, 12),
            "optimizer": _optimizer_facts(self.optimizers, self.state.backward_site),
            "unread": len(self.readback),
        }


def _frozen_modules(models: list[Any], limit: int = 4) -> list[str]:
    """The outermost modules whose parameters are all frozen (requires_grad=False) in models
    that train others: a discriminator Lightning's toggle_optimizer() froze, a backbone."""
    out: list[str] = []
    pending = [(name, module) for m in models for name, module in m.named_children()]
    while pending and len(out) < limit:
        name, module = pending.pop(0)
        flags = [p.requires_grad for p in module.parameters()]
        if flags and not any(flags):
            out.append(name)
        elif any(flags) and not all(flags):
            pending += [(f"{name}.{n}", child) for n, child in module.named_children()]
    return out


def _optimizer_facts(optimizers: Any, backward_site: Any) -> dict[str, Any] | None:
    """The primary optimizer as the loop names it, its class, and the file the loop called
    backward() from (where its construction is looked for)."""
    primary = optimizers.primary
    if primary is None:
        return None
    return {
        "label": optimizers.label(primary),
        "type": type(primary).__name__,
        "loop_file": backward_site[0] if backward_site else None,
    }


def _embeddings(models: list[Any]) -> list[tuple[str, int]]:
    """The models' id lookups (nn.Embedding and its kind): name and number of ids, a few."""
    out = []
    for m in models:
        for name, module in m.named_modules():
            size = getattr(module, "num_embeddings", None)
            if isinstance(size, int):
                out.append((name or type(module).__name__, size))
                if len(out) == 3:
                    return out
    return out


def _weight_extremes(names: Any, models: list[Any]) -> tuple[list[tuple[str, str]], float]:
    """The parameters whose weights are not finite (their names), and the largest finite
    absolute weight, on this rank's shards."""
    params = [p for m in models for p in m.parameters() if p.is_floating_point() and p.numel()]
    nonfinite, largest = [], 0.0
    for p, top in zip(params, largest_values(params), strict=True):
        if math.isfinite(top):
            largest = max(largest, top)
        else:
            nonfinite.append(names.param_name(p) or ("?", "?"))
    return nonfinite, largest
