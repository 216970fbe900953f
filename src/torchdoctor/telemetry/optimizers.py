"""The optimizers of a run: which one is the primary (its updates are the rows of
python.steps), what the training loop calls each one, and the updates in progress.

The primary is the first optimizer that steps, or the one given to `watch()`. Every other
optimizer's updates are rows of python.optimizer_steps; so are the primary's once a run has
several (docs/architecture.md, "What a step is"). An optimizer that makes HANDOVER updates
with none of the primary's between becomes the primary: the primary's training has ended and
this one's has begun (layer-wise training, a second phase with an optimizer of its own, the
next fold of a k-fold run, where an earlier fold's optimizer comes back in the next epoch);
its updates before were steps too (handover.py). Optimizers that take turns (a GAN's two)
never do: the primary steps again after the other's first few updates.
"""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any

from torchdoctor.frames import user_frame

if TYPE_CHECKING:
    from types import FrameType

# Updates in a row of a new optimizer, the primary's none, that make it the primary: more than
# a critic makes between two generator updates (5 in WGAN-GP, where the critic usually steps
# first anyway), few against a training phase of its own.
HANDOVER = 20


class Optimizers:
    __slots__ = (
        "_fresh",
        "_info",
        "_last",
        "_primary",
        "closure_checked",
        "named",
        "open",
        "several",
    )

    def __init__(self) -> None:
        self._primary: weakref.ref[Any] | None = None
        self.named = False  # watch() named the primary: a new training keeps it
        # optimizer -> (the training loop's name for it, lag): lag 1 for an optimizer that
        # first stepped after the primary had ended a step (a GAN's generator after its
        # discriminator): its updates belong to the step that just ended, not the next one
        self._info: weakref.WeakKeyDictionary[Any, tuple[str, int]] = weakref.WeakKeyDictionary()
        # the updates in progress: id -> (its step() began, its check); the steady step
        # (native/steady.cpp) adds and pops the primary's here as begin() and end() would
        self.open: dict[int, tuple[float, Any]] = {}
        self.closure_checked = False  # LBFGS: the first closure's gradients were checked
        self._last = 0  # id of the optimizer noted last (most steps: the same one again)
        self.several = False  # more than one optimizer has stepped
        # id -> updates of another optimizer since the primary's last update (cleared when
        # the primary steps again)
        self._fresh: dict[int, int] = {}

    @property
    def primary(self) -> Any:
        return self._primary() if self._primary is not None else None

    @property
    def primary_ref(self) -> weakref.ref[Any] | None:
        """The primary's weak reference (the steady step compares what it gives)."""
        return self._primary

    def adopt(self, optimizer: Any, named: bool = False) -> None:
        self._primary = weakref.ref(optimizer)
        self.named = self.named or named

    def forget_primary(self) -> None:
        """A new training may begin (a notebook cell run again): the next optimizer that steps
        becomes the primary, unless watch() named one."""
        if not self.named:
            self._primary = None

    def begin(self, optimizer: Any, now: float, check: Any) -> None:
        # the steady step does this and end()'s pop in place (native/steady.cpp)
        self.open[id(optimizer)] = (now, check)

    def end(self, optimizer: Any, now: float) -> tuple[float, Any]:
        """(when its step() began, its gradient check). The primary's update (the steady
        step's too) leaves no optimizer fresh."""
        if self._fresh and optimizer is self.primary:
            self._fresh.clear()
        return self.open.pop(id(optimizer), (now, None))

    def recheck(self, optimizer: Any, check: Any) -> None:
        """The check of an update in progress, replaced (LBFGS: the first closure's)."""
        if id(optimizer) in self.open:
            self.open[id(optimizer)] = (self.open[id(optimizer)][0], check)

    def in_progress(self, optimizer: Any) -> bool:
        return id(optimizer) in self.open

    def note(self, optimizer: Any, steps_done: int) -> bool:
        """An update begins: True when it is the optimizer's first. Its name is taken from the
        loop that steps it, now, while that loop's frame is on the stack."""
        if id(optimizer) == self._last or optimizer in self._info:
            self._last = id(optimizer)
            return False
        self._last = id(optimizer)
        taken = {label for label, _lag in self._info.values()}
        label = _label(optimizer, taken, sys._getframe(1))
        lag = 1 if optimizer is not self.primary and steps_done > 0 else 0
        self._info[optimizer] = (label, lag)
        self.several = len(self._info) > 1
        return True

    def takes_over(self, optimizer: Any) -> bool:
        """An update of `optimizer` begins (after note()): True when it becomes the primary
        now (the module docstring says when; end() clears the counts)."""
        if optimizer is self.primary or self.named:
            return False
        made = self._fresh.get(id(optimizer), 0)
        if made + 1 < HANDOVER:
            self._fresh[id(optimizer)] = made + 1
            return False
        self._fresh.clear()
        self.adopt(optimizer)
        return True

    def known(self) -> list[Any]:
        """Every optimizer that has stepped so far."""
        return list(self._info.keys())

    def stepped(self, optimizer: Any) -> bool:
        try:
            return optimizer in self._info
        except TypeError:  # not weak-referenceable: never one of ours
            return False

    def info(self, optimizer: Any) -> tuple[str, int]:
        """(its name, its lag), known from its first update."""
        return self._info.get(optimizer) or (type(optimizer).__name__, 0)

    def label(self, optimizer: Any) -> str:
        return self.info(optimizer)[0]


def learning_rate(optimizer: Any) -> float | None:
    """The learning rate of the optimizer's first parameter group (a number, or a CPU tensor:
    reading a GPU one would sync)."""
    try:
        lr = optimizer.param_groups[0]["lr"]
    except (AttributeError, IndexError, KeyError, TypeError):  # None too: no optimizer yet
        return None
    if lr.__class__ is float:  # most steps: one test
        return lr
    if isinstance(lr, (int, float)):
        return float(lr)
    device = getattr(lr, "device", None)
    if device is not None and device.type == "cpu":
        return float(lr)
    return None


def _label(optimizer: Any, taken: set[str], frame: FrameType) -> str:
    """The name the training code gives `optimizer` (a local of the loop that steps it, as in
    a `main()`, or a global of `__main__`), else its class; a number from the second of a
    name (a loop over folds' optimizers names each `opt`)."""
    caller = user_frame(frame)
    spaces = [caller.f_locals, caller.f_globals] if caller is not None else []
    main = sys.modules.get("__main__")
    if main is not None:
        spaces.append(vars(main))
    base = type(optimizer).__name__  # the class alone (Lightning's configure_optimizers)
    found = (k for space in spaces for k, v in list(space.items()) if v is optimizer)
    base = next((k for k in found if not k.startswith("_")), base)
    n = 2
    if base not in taken:
        return base
    while f"{base}{n}" in taken:
        n += 1
    return f"{base}{n}"
