"""The doctor thread: runs every diagnosis over fresh snapshots about once a second.

Placeholder until the diagnoses land: it only keeps the thread's shape.
"""

from __future__ import annotations

import threading
from typing import Any


class Doctor:
    def __init__(self, session: Any) -> None:
        self.session = session
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torchdoctor-doctor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            pass

    def stop(self) -> None:
        self._stop.set()
