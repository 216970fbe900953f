"""Checksums of the parameters DDP replicates, taken on every rank at the same steps, so that
copies that drift apart are seen (diagnose/replica_drift.py compares them).

A step listener of the Recorder: after 1, 2, 4, ... 64 steps and then every 100
(`replica_drift.due`), the float32 norm of every parameter of each DistributedDataParallel
model, computed locally (no collective of ours, ever), read back without waiting for the
device, and recorded as a `replica_checksums` event. The ranks already tell each other their
state (cluster/), which carries the recent checksums; a job directory keeps them in each
rank's events. One pass over the parameters every hundred steps: well under 1% of the
training's time.

A model is checked when the training calls its DDP wrapper, and also when it calls the module
a wrapper holds (`ddp.module(x)`, or the model it was built from): DDP never sees that
training, so no gradient is averaged and the copies drift apart. Which wrapper holds such a
model is looked up once per model, in the objects that refer to it (`gc.get_referrers`: a
few passes over the heap, once, on the first checked step; nothing is patched).
"""

from __future__ import annotations

import gc
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
        self.held: dict[int, bool] = {}  # id(root) -> whether a DDP wrapper holds it

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
            for label, names, params, through in self.replicated():
                self._check(step + 1, label, names, params, through)
        except Exception as exc:  # never into the training: say it once and stop checking
            self.detach()
            warn_once("replicas", f"replica checksums are off: {type(exc).__name__}: {exc}")

    def replicated(self) -> list[tuple[str, list[str], list[Any], bool]]:
        """(label, parameter names, parameters, trained through the wrapper) of each DDP model
        seen: called as a wrapper, or as the module a wrapper holds."""
        ddp = getattr(self.torch.nn.parallel, "DistributedDataParallel", None)
        if ddp is None:
            return []
        out = []
        for module, label in self.recorder.models.models():
            if isinstance(module, ddp):
                module, through = module.module, True
            elif self._held(module, ddp):
                through = False  # the training calls what DDP wraps: DDP never sees it
            else:
                continue
            named = list(module.named_parameters())
            if named:
                out.append((label, [n for n, _ in named], [p for _, p in named], through))
        return out

    def _held(self, module: Any, ddp: type) -> bool:
        known = self.held.get(id(module))
        if known is None:
            known = self.held[id(module)] = wrapper_of(module, ddp) is not None
        return known

    def _check(
        self, steps: int, label: str, names: list[str], params: list[Any], through: bool
    ) -> None:
        torch = self.torch
        device = params[0].device
        with torch.no_grad():
            values = torch.cat([_norm(torch, p.detach()).reshape(1).to(device) for p in params])
        recorder = self.recorder

        data: dict[str, Any] = {"step": steps, "model": label, "names": names}
        if not through:
            data["unwrapped"] = True

        def done(sums: list[float]) -> None:
            recorder.event(EVENT, {**data, "sums": sums})

        recorder.readback.submit(values, done)


def wrapper_of(module: Any, ddp: type) -> Any:
    """The DistributedDataParallel whose `module` is `module`, found among the objects that
    refer to it: its `_modules` dict, then the wrapper (or the wrapper's `__dict__`, then the
    wrapper, where the instance keeps a dict of its own)."""
    holders = [
        d for d in gc.get_referrers(module) if isinstance(d, dict) and d.get("module") is module
    ]
    for _ in range(2):
        if not holders:
            return None
        found = gc.get_referrers(*holders)
        for owner in found:
            if (
                isinstance(owner, ddp)
                and owner.__dict__.get("_modules", {}).get("module") is module
            ):
                return owner
        holders = [
            d for d in found if isinstance(d, dict) and any(d.get("_modules") is h for h in holders)
        ]
    return None


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
