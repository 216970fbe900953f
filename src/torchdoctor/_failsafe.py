"""Errors inside torchdoctor never reach the training: they are logged once, and a hook that
failed turns itself off."""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Any

log = logging.getLogger("torchdoctor")
_said: set[str] = set()
# What failed, in order (key, message): a session keeps those since its start in meta.json, so
# that a saved run judged later says what it is missing, never a bare "no problems found".
FAILURES: list[tuple[str, str]] = []


def warn_once(key: str, message: str) -> None:
    if key in _said:
        return
    _said.add(key)
    try:
        sys.stderr.write(f"torchdoctor: {message}\n")
    except Exception:
        pass
    log.debug("torchdoctor: %s", message, exc_info=True)


def failed(key: str, message: str) -> None:
    """A part of torchdoctor failed: said once, and kept for the run's record."""
    FAILURES.append((key, message))
    warn_once(key, message)


def failures_since(start: int) -> list[str]:
    """The failures from FAILURES[start] on, each once."""
    return list(dict(FAILURES[start:]).values())


def keep_to_exit(obj: Any) -> None:
    """Never free `obj`: for what holds GPU events and pinned buffers of a context an error
    broke, whose destructors would print torch's warnings or end the process."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Switch:
    """An on/off flag a group of hooks consults; a failure in any of them turns it off."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.on = True

    def fail(self, exc: BaseException) -> None:
        self.on = False
        if str(exc).strip().startswith("CUDA error"):  # the device's, met first by a hook
            failed(
                f"hook:{self.name}",
                f"{self.name} stopped: the GPU reported an error to it "
                f"({first_line(exc)}); the training meets it at its next GPU call",
            )
            return
        failed(
            f"hook:{self.name}",
            f"{self.name} failed ({type(exc).__name__}: {exc}) and was switched off; "
            "the training goes on",
        )
