"""Errors inside torchdoctor never reach the training: they are logged once, and a hook that
failed turns itself off."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("torchdoctor")
_said: set[str] = set()
F = TypeVar("F", bound=Callable[..., Any])


def warn_once(key: str, message: str) -> None:
    if key in _said:
        return
    _said.add(key)
    try:
        sys.stderr.write(f"torchdoctor: {message}\n")
    except Exception:
        pass
    log.debug("torchdoctor: %s", message, exc_info=True)


class Switch:
    """An on/off flag a group of hooks consults; a failure in any of them turns it off."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.on = True

    def fail(self, exc: BaseException) -> None:
        self.on = False
        warn_once(
            f"hook:{self.name}",
            f"{self.name} failed ({type(exc).__name__}: {exc}) and was switched off; "
            "the training goes on",
        )


def guarded(switch: Switch, default: Any = None) -> Callable[[F], F]:
    """Run the hook body only while `switch` is on; an exception switches it off."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if not switch.on:
                return default
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                switch.fail(exc)
                return default

        return inner  # type: ignore[return-value]

    return wrap
