"""Checksums of the parameters DDP replicates, taken on every rank at the same steps, so that
copies that drift apart are seen (diagnose/replica_drift.py compares them).

A step listener of the Recorder: after 1, 2, 4, ... 64 steps and then every 100
(`replica_drift.due`), the float32 norm of every parameter of each DistributedDataParallel
model, computed locally (no collective of ours, ever), read back without waiting for the
device, and recorded as a `replica_checksums` event. The ranks already tell each other their
state (cluster/), which carries the recent checksums; a job directory keeps them in each
rank's events. One pass over the parameters every hundred steps: well under 1% of the
training's time.
"""

from __future__ import annotations

from typing import Any, Protocol

from torchdoctor._failsafe import warn_once
from torchdoctor.diagnose.replica_drift import EVENT, due
from torchdoctor.telemetry.invisible import compiling
from torchdoctor.telemetry.patches import Hooks


class StepSource(Protocol):
    """What the checks need of the Recorder."""

    torch: Any
    step_listeners: list[Any]
    hooks: Hooks
    models: Any  # telemetry.models.Models
    readback: Any  # telemetry.readback.Readback

    def event(self, kind: str, data: dict[str, Any]) -> None: ...


class ReplicaChecks:
    def __init__(self, recorder: StepSource) -> None:
        self.recorder = recorder
        self.torch = recorder.torch
        self.on = True

    def attach(self) -> ReplicaChecks:
        self.recorder.step_listeners.append(self.on_step)
        self.recorder.hooks.on_remove(self.detach)
        return self

    def detach(self) -> None:
        self.on = False
        try:
            self.recorder.step_listeners.remove(self.on_step)
        except ValueError:
            pass

    def on_step(self, _state: Any, step: int) -> None:
        if not self.on or not due(step + 1) or compiling():
            return
        try:
            for label, names, params in self.replicated():
                self._check(step + 1, label, names, params)
        except Exception as exc:  # never into the training: say it once and stop checking
            self.detach()
            warn_once("replicas", f"replica checksums are off: {type(exc).__name__}: {exc}")

    def replicated(self) -> list[tuple[str, list[str], list[Any]]]:
        """(label, parameter names, parameters) of each DDP model seen."""
        ddp = getattr(self.torch.nn.parallel, "DistributedDataParallel", None)
        out = []
        for module, label in self.recorder.models.models():
            if ddp is None or not isinstance(module, ddp):
                continue
            named = list(module.module.named_parameters())
            if named:
                out.append((label, [n for n, _ in named], [p for _, p in named]))
        return out

    def _check(self, steps: int, label: str, names: list[str], params: list[Any]) -> None:
        torch = self.torch
        device = params[0].device
        with torch.no_grad():
            values = torch.cat([_norm(torch, p.detach()).reshape(1).to(device) for p in params])
        recorder = self.recorder

        def done(sums: list[float]) -> None:
            recorder.event(EVENT, {"step": steps, "model": label, "names": names, "sums": sums})

        recorder.readback.submit(values, done)


CHUNK = 1 << 24  # elements cast to float32 at a time: a bounded temporary for half types


def _norm(torch: Any, p: Any) -> Any:
    """The float32 norm of a parameter; half-precision ones in chunks, so that no float32 copy
    of a whole large tensor is made."""
    if p.dtype in (torch.float32, torch.float64) or not p.is_floating_point():
        return torch.linalg.vector_norm(p.float() if not p.is_floating_point() else p).float()
    flat = p.reshape(-1)
    if flat.numel() <= CHUNK:
        return torch.linalg.vector_norm(flat, dtype=torch.float32)
    squares = sum(
        torch.linalg.vector_norm(flat[i : i + CHUNK], dtype=torch.float32).square()
        for i in range(0, flat.numel(), CHUNK)
    )
    return squares.sqrt()


def attach(recorder: Any) -> ReplicaChecks | None:
    """Start the checks on a Recorder (None when it lacks the seam)."""
    if not isinstance(getattr(recorder, "step_listeners", None), list):
        return None
    return ReplicaChecks(recorder).attach()
