"""The live status line of `torchdoctor run`, redrawn twice a second when stderr is a terminal."""

from __future__ import annotations

import shutil
import threading
from typing import Any

from torchdoctor.report.progress import render_status


class StatusLine:
    def __init__(self, session: Any, interval: float = 0.5) -> None:
        self.session = session
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torchdoctor-status", daemon=True)

    def start(self) -> StatusLine:
        self._thread.start()
        return self

    def _loop(self) -> None:
        from torchdoctor.session import show_status_line

        while not self._stop.wait(self.interval):
            recorder = self.session.telemetry
            last = dict(recorder.last) if recorder is not None else {}
            doctor = self.session.doctor
            found = len(doctor.found()) if doctor is not None else 0
            width = shutil.get_terminal_size((100, 20)).columns - 1
            try:
                show_status_line(render_status(last, found, width))
            except Exception:
                return

    def stop(self) -> None:
        from torchdoctor.session import erase_status_line

        self._stop.set()
        self._thread.join(timeout=2)
        erase_status_line()
