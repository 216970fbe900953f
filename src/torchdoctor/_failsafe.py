"""Errors inside torchdoctor never reach the training: they are logged once, and a hook that
failed turns itself off."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("torchdoctor")
_said: set[str] = set()


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
        text = str(exc).strip()
        if text.startswith("CUDA error"):  # the device's error, met first by a hook: not ours
            warn_once(
                f"hook:{self.name}",
                f"{self.name} stopped: the GPU reported an error to it "
                f"({text.splitlines()[0]}); the training meets it at its next GPU call",
            )
            return
        warn_once(
            f"hook:{self.name}",
            f"{self.name} failed ({type(exc).__name__}: {exc}) and was switched off; "
            "the training goes on",
        )
