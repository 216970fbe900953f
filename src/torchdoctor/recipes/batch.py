"""The first batch, fed again and again.

Where the batch comes from decides how it is captured, at the end of the first step:
- a DataLoader (any loop over `DataLoader` iterators): the last batch fetched before the first
  step ended is kept (a deep copy, taken when it was fetched), and every later `next()` on an
  iterator over the same dataset returns a fresh copy of it; the iterator never runs out, so
  an epoch loop keeps going until the recipe stops the script. Other data sets (validation)
  are left alone.
- no DataLoader (a loop that slices tensors itself, or builds batches in Python): the tensors
  the first step passed to its outermost module calls (the model, a loss module) and to
  torch.nn.functional's loss functions are kept, and each later step's k-th such call gets
  them back at the same argument positions. Only tensors outside the autograd graph are
  replaced (data, targets), never a model's output. Not covered: a target used in a
  hand-written loss (`((out - y[i:j]) ** 2).mean()`) and keyword arguments to the model.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, Any

from torchdoctor.telemetry.invisible import compiling

if TYPE_CHECKING:
    from torchdoctor.telemetry.patches import Hooks

CAPTURE, DATALOADER, CALLS, NONE = "capture", "dataloader", "calls", "none"


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "requires_grad") and hasattr(value, "grad_fn")


def data_only(value: Any) -> Any:
    """A copy of the data in `value`: tensors outside the autograd graph cloned, containers
    walked, anything else kept as None (a placeholder that is never replaced)."""
    if _is_tensor(value):
        return None if value.requires_grad else value.detach().clone()
    if isinstance(value, (tuple, list)):
        return [data_only(v) for v in value]
    if isinstance(value, dict):
        return {k: data_only(v) for k, v in value.items()}
    return None


def merge(current: Any, kept: Any) -> Any:
    """`current` with its data tensors replaced by the kept ones (fresh copies)."""
    if kept is None:
        return current
    if _is_tensor(current):
        if current.requires_grad or not _is_tensor(kept):
            return current
        return kept.clone()
    if isinstance(current, (tuple, list)) and isinstance(kept, list) and len(kept) == len(current):
        items = [merge(c, k) for c, k in zip(current, kept, strict=True)]
        if isinstance(current, tuple):
            return type(current)(*items) if hasattr(current, "_fields") else tuple(items)
        return items
    if isinstance(current, dict) and isinstance(kept, dict):
        out = dict(current)
        for key, value in kept.items():
            if key in out:
                out[key] = merge(out[key], value)
        return type(current)(out) if type(current) is not dict else out
    return current


class BatchReplay:
    def __init__(self, torch: Any, hooks: Hooks, depth: Any) -> None:
        self.phase = CAPTURE
        self.thread = threading.main_thread().ident
        self._fetched: tuple[Any, Any] | None = None  # (dataset, deep copy of the batch)
        self.source: Any = None  # the dataset whose iterators now replay
        self.batch: Any = None
        self.fetches = 0  # batches fetched during the first step
        self.replayed = 0
        self._calls: list[tuple[type, Any]] = []  # first step: (module type, data args)
        self._call_index = 0
        self.losses: list[Any] = []  # first step: data args of functional loss calls
        self._loss_index = 0
        self.description = ""
        depth.on_root.append(self._root_call)
        self._patch_dataloader(torch, hooks)

    # -- DataLoader ---------------------------------------------------------------------------
    def _patch_dataloader(self, torch: Any, hooks: Hooks) -> None:
        from torch.utils.data import dataloader as dl

        base = dl._BaseDataLoaderIter
        inner = base.__dict__["__next__"]  # the Recorder's wrapper, when it is installed
        replay = self

        def __next__(it: Any) -> Any:
            if compiling() or threading.get_ident() != replay.thread:
                return inner(it)
            dataset = getattr(it, "_dataset", None)
            if replay.phase == DATALOADER and dataset is replay.source:
                replay.replayed += 1
                return copy.deepcopy(replay.batch)
            batch = inner(it)
            if replay.phase == CAPTURE:
                replay.fetches += 1
                replay._fetched = (dataset, copy.deepcopy(batch))
            elif replay.phase == DATALOADER and dataset is replay.source:
                # the first step ended inside this fetch (a loop without an optimizer)
                replay.replayed += 1
                return copy.deepcopy(replay.batch)
            return batch

        hooks.patch(base, "__next__", __next__)

    # -- calls --------------------------------------------------------------------------------
    def _root_call(self, module: Any, args: Any) -> Any:
        if self.phase == CAPTURE:
            self._calls.append((type(module), data_only(list(args))))
            return None
        if self.phase != CALLS:
            return None
        index = self._call_index
        self._call_index += 1
        if index >= len(self._calls) or self._calls[index][0] is not type(module):
            return None
        self.replayed += 1
        return tuple(merge(list(args), self._calls[index][1]))

    def loss_call(self, args: list[Any], inside_module: bool) -> list[Any] | None:
        """A functional loss called by the script itself: keep or replace its targets."""
        if inside_module:
            return None  # a loss module's call: its arguments were handled at the module
        if self.phase == CAPTURE:
            self.losses.append(data_only(args))
            return None
        if self.phase != CALLS:
            return None
        index = self._loss_index
        self._loss_index += 1
        if index >= len(self.losses):
            return None
        return list(merge(args, self.losses[index]))

    # -- the first step's end ------------------------------------------------------------------
    def first_step_ended(self) -> None:
        if self._fetched is not None:
            self.source, self.batch = self._fetched
            self.phase = DATALOADER
            self.description = "the DataLoader's first batch, returned by every later next()"
        elif any(any(_has_tensor(a) for a in args) for _t, args in self._calls):
            self.phase = CALLS
            self.description = (
                "the first step's model inputs and loss targets, given again at every call"
            )
        else:
            self.phase = NONE
        self._fetched = None

    def step_ended(self) -> None:
        self._call_index = 0
        self._loss_index = 0

    def shapes(self) -> list[str]:
        """The captured batch's tensors, as shapes (for the report)."""
        found: list[Any] = []
        _collect(self.batch if self.phase == DATALOADER else [a for _t, a in self._calls], found)
        return [f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in found[:8]]


def _has_tensor(value: Any) -> bool:
    found: list[Any] = []
    _collect(value, found)
    return bool(found)


def _collect(value: Any, out: list[Any], depth: int = 0) -> None:
    if depth > 4 or len(out) > 16:
        return
    if _is_tensor(value):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _collect(item, out, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            _collect(item, out, depth + 1)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        for item in list(vars(value).values())[:32]:
            _collect(item, out, depth + 1)
