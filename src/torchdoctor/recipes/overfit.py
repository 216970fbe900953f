"""The overfit mode in the training process: the first batch fed again and again (batch.py),
the loss function watched (losses.py), and at the end of every step the numbers the verdict
needs: loss, accuracy on the batch, gradient norm, and how far each update moved the weights.
After `steps` steps the script is stopped (StopTraining)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from torchdoctor.recipes import verdict
from torchdoctor.recipes.batch import NONE, BatchReplay
from torchdoctor.recipes.losses import LossWatch
from torchdoctor.recipes.mode import Depth, StopTraining
from torchdoctor.telemetry.patches import Hooks

if TYPE_CHECKING:
    from torchdoctor.telemetry.recorder import Recorder
    from torchdoctor.telemetry.step import StepState


class OverfitMode:
    def __init__(self, recorder: Recorder, torch: Any, steps: int) -> None:
        self.rec = recorder
        self.torch = torch
        self.limit = steps
        self.hooks = Hooks()
        self.depth = Depth(torch, self.hooks)
        self.replay = BatchReplay(torch, self.hooks, self.depth)
        self.losses = LossWatch(torch, self.hooks, self.depth, self.replay)
        self.armed = True
        self.steps = 0
        self.series: dict[str, list[Any]] = {
            "loss": [],
            "accuracy": [],
            "grad_norm": [],
            "update_ratio": [],
        }
        self.params: list[tuple[str, Any]] = []  # (name, parameter) of the models
        self._snapshot: list[Any] = []  # trainable weights at the end of the previous step
        self._trainable: list[int] = []  # indexes into params
        self.changed: list[bool] = []
        self.grad_seen: list[bool] = []
        self.grad_nonzero: list[bool] = []
        self.no_batch = False
        recorder.step_listeners.append(self._on_step)
        self.hooks.on_remove(lambda: _discard(recorder.step_listeners, self._on_step))
        recorder.silent.batches_repeat_on_purpose()

    # -- every step -----------------------------------------------------------------------------
    def _on_step(self, state: StepState, step: int) -> None:
        self.steps = step + 1
        losses = state.step_losses()
        self.series["loss"].append(_mean(losses))
        self.losses.step_ended(losses)
        last = self.losses.last
        self.series["accuracy"].append(last.accuracy if last is not None else None)
        norm = state.grad_norm_value
        if norm is None and state.grad_norm is not None:
            norm = float(state.grad_norm)
        self.series["grad_norm"].append(norm)
        self.losses.last = None
        self.replay.step_ended()
        if step == 0:
            self.replay.first_step_ended()
            self._watch_params()
            self.series["update_ratio"].append(None)
            if self.replay.phase == NONE:
                self.no_batch = True
                self._stop()
        else:
            self.series["update_ratio"].append(self._update_ratio())
        if self.steps >= self.limit:
            self._stop()

    def _stop(self) -> None:
        if self.armed:
            raise StopTraining

    # -- parameters ---------------------------------------------------------------------------
    def _watch_params(self) -> None:
        torch = self.torch
        seen: set[int] = set()
        for model, label in self.rec.models.models():
            for param in model.parameters():
                if id(param) in seen:
                    continue
                seen.add(id(param))
                named = self.rec.models.param_name(param)
                name = f"{named[0]}.{named[1]}" if named else f"{label}.?"
                self.params.append((name, param))
        n = len(self.params)
        self.changed, self.grad_seen, self.grad_nonzero = [False] * n, [False] * n, [False] * n
        for i, (_name, param) in enumerate(self.params):
            if param.requires_grad:
                self._trainable.append(i)
                self.hooks.handle(param.register_post_accumulate_grad_hook(self._grad_hook(i)))
        with torch.no_grad():
            self._snapshot = [self.params[i][1].detach().clone() for i in self._trainable]

    def _grad_hook(self, index: int) -> Any:
        def hook(param: Any) -> None:
            self.grad_seen[index] = True
            if not self.grad_nonzero[index] and param.grad is not None:
                self.grad_nonzero[index] = bool(param.grad.detach().ne(0).any())

        return hook

    def _update_ratio(self) -> float | None:
        """|weights now - weights after the previous step| / |weights then|, over every
        trainable parameter; also marks the parameters that moved."""
        torch = self.torch
        if not self._trainable:
            return None
        with torch.no_grad():
            current = [self.params[i][1].detach() for i in self._trainable]
            diffs = torch._foreach_sub(current, self._snapshot)
            d = [float(v) for v in torch._foreach_norm(diffs)]
            w = [float(v) for v in torch._foreach_norm(self._snapshot)]
            torch._foreach_copy_(self._snapshot, current)
        for k, i in enumerate(self._trainable):
            if d[k] > 0:
                self.changed[i] = True
        total_w = math.sqrt(sum(x * x for x in w))
        total_d = math.sqrt(sum(x * x for x in d))
        return total_d / total_w if total_w > 0 else None

    # -- the end --------------------------------------------------------------------------------
    def disarm(self) -> None:
        self.armed = False

    def remove(self) -> None:
        self.hooks.remove()

    def facts(self) -> dict[str, Any]:
        """Everything the verdict reads, as plain data."""
        in_optimizer = self._in_optimizer()
        params = []
        for i, (name, param) in enumerate(self.params):
            params.append(
                {
                    "name": name,
                    "numel": int(param.numel()),
                    "requires_grad": bool(param.requires_grad),
                    "in_optimizer": in_optimizer.get(id(param)),
                    "grad_seen": self.grad_seen[i],
                    "grad_nonzero": self.grad_nonzero[i],
                    "changed": self.changed[i],
                }
            )
        return {
            "steps": self.steps,
            "limit": self.limit,
            "series": self.series,
            "params": params,
            "lr": self.rec.lr(),
            "optimizer": type(self.rec.primary).__name__ if self.rec.primary is not None else None,
            "loss_functions": dict(self.losses.names),
            "reductions": dict(self.losses.reductions),
            "label_smoothing": self.losses.label_smoothing,
            "findings": list(self.losses.findings.values()),
            "batch": {
                "source": self.replay.phase,
                "description": self.replay.description,
                "tensors": self.replay.shapes(),
                "fetches_in_first_step": self.replay.fetches,
                "replayed": self.replay.replayed,
            },
            "no_batch": self.no_batch,
            "silent": [[kind, data] for kind, data in self.rec.silent.facts],
        }

    def _in_optimizer(self) -> dict[int, bool]:
        primary = self.rec.primary
        if primary is None:
            return {}
        held = {id(p) for group in primary.param_groups for p in group["params"]}
        return {id(p): id(p) in held for _n, p in self.params}

    def result(self) -> dict[str, Any]:
        facts = self.facts()
        return {**facts, **verdict.judge(facts)}


def _mean(values: list[Any]) -> float | None:
    floats = [float(v) for v in values]
    return sum(floats) / len(floats) if floats else None


def _discard(items: list[Any], item: Any) -> None:
    if item in items:
        items.remove(item)
