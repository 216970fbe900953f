"""Shapes on traced steps: each module call's input and output shapes, dtypes and devices, one
python.shapes row per call, in call order (a parent before its children, as torchinfo lists
them). Recorded from the global module hooks, which are on only for the first step (model
discovery) and traced steps: untraced steps pay nothing.

The calls of the step in progress stay in memory until it ends, so a crash in the middle of a
step still has the shapes that flowed into the module that raised.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any

from torchdoctor.views import ModuleCall

MAX_TENSORS = 8  # tensors listed per call side (a module taking a list of 100 tensors)


class ShapeRecorder:
    def __init__(self, recorder: Any) -> None:
        self.rec = recorder
        self.step = 0
        self._calls: list[list[Any]] = []  # the step in progress, in call order
        self._stack: list[tuple[Any, list[Any]]] = []  # (module, its record) of open calls
        self.last: tuple[int, list[ModuleCall]] | None = None  # the last finished step

    def begin(self, step: int) -> None:
        self.step = step
        self._calls = []
        self._stack = []

    def enter(self, module: Any, name: str, args: Any) -> None:
        shapes, dtypes, devices = _describe(args)
        record = [
            self.step,
            len(self._calls),
            name,
            type(module).__name__,
            len(self._stack),
            shapes,
            dtypes,
            devices,
            None,
            None,
            None,
            False,
        ]
        self._calls.append(record)
        self._stack.append((module, record))

    def exit(self, module: Any, output: Any) -> None:
        if not self._stack or self._stack[-1][0] is not module:
            return  # a call that started before recording began
        _module, record = self._stack.pop()
        if output is None and sys.exc_info()[1] is not None:
            record[11] = True  # torch calls always_call hooks with no output when forward raised
            return
        record[8], record[9], record[10] = _describe(output)

    def end(self) -> None:
        """The step is over (or the run ends in the middle of one): its rows go to the table."""
        calls, self._calls, self._stack = self._calls, [], []
        if not calls:
            return
        rank = self.rec.rank
        self.rec.tables["shapes"].extend((*tuple(c), rank) for c in calls)
        self.last = (calls[0][0], [_as_call(c) for c in calls])

    def flow(self) -> tuple[int | None, list[ModuleCall], bool]:
        """The calls of the step in progress (True), else of the last recorded step (False)."""
        if self._calls:
            return self.step, [_as_call(c) for c in self._calls], True
        if self.last is not None:
            return self.last[0], self.last[1], False
        return None, [], False


_KEYS = tuple(f.name for f in dataclasses.fields(ModuleCall))  # a record's order


@dataclasses.dataclass(frozen=True)
class ModuleParams:
    """The parameters of a module's whole subtree."""

    params: int
    trainable: int


@dataclasses.dataclass(kw_only=True)
class ShapeCall(ModuleCall):
    """One module call of a python.shapes row read back, with its rank and its module's
    parameters from python.modules where they are known."""

    rank: int
    params: ModuleParams | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any], params: ModuleParams | None) -> ShapeCall:
        names = [f.name for f in dataclasses.fields(cls) if f.name != "params"]
        return cls(**{name: row[name] for name in names}, params=params)


@dataclasses.dataclass(frozen=True)
class StepShapes:
    """What `torchdoctor shapes` shows: one step's module calls on one rank, and the steps
    that have shapes."""

    step: int
    rank: int
    steps: list[int]
    calls: list[ShapeCall]


def _as_call(record: list[Any]) -> ModuleCall:
    return ModuleCall(**dict(zip(_KEYS, record, strict=True)))


def _tensors(value: Any, out: list[Any], depth: int = 0) -> None:
    if len(out) >= MAX_TENSORS or depth > 3:
        return
    if hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "device"):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _tensors(item, out, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(item, out, depth + 1)


def _describe(value: Any) -> tuple[str | None, str | None, str | None]:
    """('[8, 3, 32, 32], [8]', 'float32, int64', 'cpu, cpu') of the tensors in `value`."""
    found: list[Any] = []
    _tensors(value, found)
    if not found:
        return None, None, None
    try:
        shapes = ", ".join(str(list(t.shape)) for t in found)
        dtypes = ", ".join(str(t.dtype).removeprefix("torch.") for t in found)
        devices = ", ".join(str(t.device) for t in found)
    except Exception:  # a tensor subclass without plain shapes (a symbolic one)
        return None, None, None
    return shapes, dtypes, devices
