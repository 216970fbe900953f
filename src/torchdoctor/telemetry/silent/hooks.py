"""The two methods the silent-error checks watch: `nn.Module.train` (which train()/eval() call
reached a module, and from where: modes.py) and the learning-rate schedulers' `step` (the
scheduler checks: schedulers.py). Both are called a few times per epoch at most.

Neither is wrapped: a wrapper's frame would stand between the caller and the method, and
move what the method's own warnings point at (`lr_scheduler.step()` warns with stacklevel=2:
wrapped, the warning would name our file instead of the user's line). Each is replaced on its
class by a `LookupHook`, a descriptor that reports the instance whose method is looked up and
hands back the original bound method, which then runs with no frame of ours on the stack.
Accessed on the class, it gives the original function itself (`nn.Module.train is` the
function it always was, and `super().train(mode)` finds it too).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchdoctor.telemetry.invisible import compiling
from torchdoctor.telemetry.patches import ORIGINAL, Hooks, unpatched

if TYPE_CHECKING:
    from types import FrameType

_get_ident = threading.get_ident


class LookupHook:
    """A method that tells `seen(instance, caller_frame)` whenever it is looked up on an
    instance (which is how it is called), then gives the original bound method."""

    def __init__(self, function: Any, seen: Callable[[Any, Any], None]) -> None:
        self.function = function
        self.seen = seen
        self.__wrapped__ = function
        setattr(self, ORIGINAL, function)
        self.__doc__ = function.__doc__
        self.__name__ = function.__name__
        self.__qualname__ = function.__qualname__

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is not None:
            self.seen(instance, sys._getframe(1))
        return self.function.__get__(instance, owner)


def thread_check(silent: Any) -> Callable[[], bool]:
    """Whether a watched call is to be looked at: telemetry and the checks on, the training
    thread, not inside a region Dynamo compiles."""
    rec = silent.rec

    def on() -> bool:
        return (
            rec.switch.on
            and silent.switch.on
            and _get_ident() == rec.train_thread
            and not compiling()
        )

    return on


def install(silent: Any, torch: Any, hooks: Hooks) -> None:
    on = thread_check(silent)

    # -- nn.Module.train: the outermost train()/eval() call ------------------------------------
    module_cls = torch.nn.Module
    original_train = unpatched(module_cls.__dict__["train"])
    train_code = original_train.__code__

    def train_seen(module: Any, frame: FrameType) -> None:
        # nn.Module.train looks up train() on every child: only the outermost call counts.
        if frame.f_code is train_code or not on():
            return
        try:
            silent.modes.on_train(module, frame)
        except Exception as exc:
            silent.fail(exc)

    hooks.patch(module_cls, "train", LookupHook(original_train, train_seen))
    silent.modes.original_train = original_train

    # -- the schedulers' step() ----------------------------------------------------------------
    from torch.optim import lr_scheduler

    def step_seen(scheduler: Any, frame: FrameType) -> None:
        if not on():
            return
        try:
            silent.schedulers.on_step(scheduler, frame)
        except Exception as exc:
            silent.fail(exc)

    for cls in _scheduler_classes(lr_scheduler):
        hooks.patch(cls, "step", LookupHook(unpatched(cls.__dict__["step"]), step_seen))


def _scheduler_classes(lr_scheduler: Any) -> list[type]:
    """The scheduler classes with a step() of their own, containers left out (their step()
    steps the schedulers they hold, which are seen)."""
    base = getattr(lr_scheduler, "LRScheduler", None) or lr_scheduler._LRScheduler
    containers = {"SequentialLR", "ChainedScheduler"}
    out = []
    for cls in vars(lr_scheduler).values():
        if (
            isinstance(cls, type)
            and issubclass(cls, base)
            and "step" in cls.__dict__
            and cls.__name__ not in containers
        ):
            out.append(cls)
    plateau = getattr(lr_scheduler, "ReduceLROnPlateau", None)
    if plateau is not None and plateau not in out and "step" in plateau.__dict__:
        out.append(plateau)
    return out
