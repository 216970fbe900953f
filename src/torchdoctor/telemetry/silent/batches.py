"""The batches a model is given: the same one again, or its batch dimension collapsed to 1.

On a sampled step, the tensors passed to the step's first CALLS model calls are fingerprinted:
for each, its shape and three float64 sums over its elements (plain, and weighted by two fixed
ramps, so that a reordering changes them). Two steps with equal fingerprints had
the same batch. (Several calls, because an RL update's first call is the policy on an
episode's first observation, which a deterministic reset repeats; the next ones differ.)
Computed on the batch's device and read back through the Readback; tensors over 4M elements
are fingerprinted on a strided sample. A recipe that repeats the batch on purpose (overfit)
switches this off.

At the end of each window of consecutive sampled steps (steps 1-3, then each pair) a
`silent.batches` fact says which steps were compared, which of them had identical batches,
whether a DataLoader fetch happened in each, the leading dimension of each tensor, and a
digest of each step's batch (the ranks of a job compare theirs: diagnose/same_batches.py).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from torchdoctor.telemetry.local_shards import local

MAX_TENSORS = 8
CALLS = 4
MAX_ELEMENTS = 1 << 22


class Batches:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.on = True  # off while a recipe repeats the batch on purpose
        self.parts: list[Any] = []  # the step in progress: fingerprints of its model calls
        self.shapes: list[list[int]] = []
        self.model: str | None = None
        self.fetched = False  # a DataLoader fetch came before the step's first model call
        self.window: list[dict[str, Any]] = []  # the current window's steps, as read back
        self.expected = 0  # fingerprints submitted in the current window
        self.closed = False  # the window's last step ended (its values may still be on the way)
        self._ramps: dict[tuple[int, Any], Any] = {}

    def on_model_call(self, module: Any, args: Any, kwargs: Any) -> None:
        if not self.on or len(self.parts) >= CALLS:
            return
        torch = self.host.torch
        tensors = _tensors(torch, args, kwargs)
        if not tensors:
            return
        if not self.parts:
            self.model = self.host.rec.models.name_of(module)
            self.fetched = self.host.fetches > 0
        device = tensors[0].device
        self.parts.append(torch.cat([self._fingerprint(t).to(device) for t in tensors]))
        if not self.shapes:
            self.shapes = [list(t.shape) for t in tensors]

    def _submit(self, step: int) -> None:
        parts, self.parts = self.parts, []
        shapes, self.shapes = self.shapes, []
        if not parts:
            return
        torch = self.host.torch
        entry = {"step": step, "shapes": shapes, "fetched": self.fetched, "model": self.model}
        entry["calls"] = len(parts)
        self.expected += 1

        def done(values: list[float]) -> None:
            entry["fingerprint"] = values
            self.window.append(entry)
            self._summary()

        device = parts[0].device
        self.host.rec.readback.submit(torch.cat([p.to(device) for p in parts]), done)

    def _fingerprint(self, t: Any) -> Any:
        torch = self.host.torch
        flat = local(t).detach().reshape(-1)
        n = flat.numel()
        if n > MAX_ELEMENTS:
            flat = flat[:: n // MAX_ELEMENTS + 1]
            n = flat.numel()
        v = flat.to(torch.float64)
        key = (n, v.device)
        weights = self._ramps.get(key)
        if weights is None:
            i = torch.arange(n, device=v.device, dtype=torch.float64)
            weights = torch.stack(
                [torch.ones_like(i), torch.cos(i * 0.6180339), torch.sin(i * 0.3)]
            )
            if len(self._ramps) > 8:  # sizes seen: batches mostly keep theirs
                self._ramps.clear()
            self._ramps[key] = weights
        return torch.mv(weights, v)

    def step_ended(self, step: int, next_sampled: bool) -> None:
        """A sampled step ended: when the next is not sampled, the window is closed."""
        self._submit(step)
        if not next_sampled:
            self.closed = True
            self._summary()

    def _summary(self) -> None:
        """The closed window's fact, once every fingerprint in it has been read back."""
        if not self.closed or len(self.window) < self.expected:
            return
        window, self.window = self.window, []
        self.expected, self.closed = 0, False
        if len(window) < 2:
            return
        same = []
        for i, a in enumerate(window):
            for b in window[i + 1 :]:
                if a["shapes"] == b["shapes"] and a["fingerprint"] == b["fingerprint"]:
                    same.append([a["step"], b["step"]])
        data = {
            "steps": [e["step"] for e in window],
            "same": same,
            "fetched": [e["fetched"] for e in window],
            "shapes": window[-1]["shapes"],
            "lead": [[s[0] if s else None for s in e["shapes"]] for e in window],
            "model": window[-1]["model"],
            # each step's batch in a few characters: the ranks of a job compare them
            "digests": [digest(e["shapes"], e["fingerprint"]) for e in window],
        }
        self.host.emit("batches", data)


def digest(shapes: list[list[int]], fingerprint: list[float]) -> str:
    """A batch's shapes and fingerprint as 16 hex digits: equal batches, equal digests."""
    text = json.dumps([shapes, [float(v).hex() for v in fingerprint]])
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _tensors(torch: Any, args: Any, kwargs: Any) -> list[Any]:
    """The tensors among a call's arguments (and one level into lists, tuples and dicts)."""
    out: list[Any] = []
    items = list(args) + list((kwargs or {}).values())
    for item in items:
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, (list, tuple)):
            out.extend(x for x in item if isinstance(x, torch.Tensor))
        elif isinstance(item, dict):
            out.extend(x for x in item.values() if isinstance(x, torch.Tensor))
        if len(out) >= MAX_TENSORS:
            break
    return [
        t
        for t in out[:MAX_TENSORS]
        if not t.is_complex() and t.layout == torch.strided and t.numel() > 0
    ]
