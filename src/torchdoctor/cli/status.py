"""The live status line of `torchdoctor run`, kept on the terminal's last line (stderr a tty).

The script's own output must never be glued to it. While the line is shown, sys.stdout and
sys.stderr (those that are terminals) are wrapped: a write first erases the status line, then
goes to the real stream unchanged; the line is redrawn only when every wrapped stream has
ended its line, so a partial line (`print(x, end="")`, a progress bar's `\\r`) is never drawn
over. Streams that are not terminals are never wrapped: a pipe or a file gets the script's
bytes exactly. Bytes written around the wrappers (`sys.stdout.buffer`, `os.write`, C code) are
not seen.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from typing import Any

from torchdoctor.report.progress import render_status
from torchdoctor.session import _print_lock, erase_status_line, show_status_line

MIN_GAP = 0.1  # at most ten redraws a second, however much the script prints


class EndsLines:
    """A text stream that erases the status line before each write and notes whether its
    output ended a line. Everything else is the wrapped stream's own."""

    def __init__(self, stream: Any, status: StatusLine) -> None:
        self._stream = stream
        self._status = status
        self._pid = os.getpid()
        self.at_line_start = True

    def write(self, text: str) -> Any:
        if os.getpid() != self._pid:  # a forked child: its parent's lock may be held forever
            return self._stream.write(text)
        with _print_lock:
            erase_status_line(self._status.terminal)
            written = self._stream.write(text)
            if text:
                self.at_line_start = text.endswith("\n")
                if self.at_line_start and self._status.session._held:
                    self._status.line_ended()
        if text and self.at_line_start:
            self._status.wake()
        return written  # what the stream itself returns (a count, or None for some)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if os.getpid() != self._pid:
            self._stream.flush()
            return
        with _print_lock:
            if not self.at_line_start:  # a partial line is about to appear after the status
                erase_status_line(self._status.terminal)
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class StatusLine:
    def __init__(self, session: Any, interval: float = 0.5) -> None:
        self.session = session
        self.interval = interval
        self.terminal = sys.stderr  # the real stderr, where the line is drawn
        self._wrapped: list[tuple[str, Any, EndsLines]] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torchdoctor-status", daemon=True)

    def start(self) -> StatusLine:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if _is_tty(stream):
                wrapper = EndsLines(stream, self)
                self._wrapped.append((name, stream, wrapper))
                setattr(sys, name, wrapper)
        self.session.mid_line = self.mid_line  # alerts wait for the end of the script's line
        self._thread.start()
        return self

    def mid_line(self) -> bool:
        """The script is in the middle of a line on the terminal."""
        return not all(w.at_line_start for _n, _s, w in self._wrapped)

    def line_ended(self) -> None:
        """Under the print lock: the script's line ended; flush what waited for it."""
        if not self.mid_line():
            for _name, stream, _w in self._wrapped:
                stream.flush()  # the script's line first, then what waited for its end
            self.session.release_held()

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.draw()
            except Exception:
                return
            self._stop.wait(MIN_GAP)

    def draw(self) -> None:
        recorder = self.session.telemetry
        last = recorder.last if recorder is not None else None
        doctor = self.session.doctor
        found = len(doctor.found()) if doctor is not None else 0
        width = shutil.get_terminal_size((100, 20)).columns - 1
        text = render_status(last, found, width)
        with _print_lock:
            if self._stop.is_set():
                return
            if not all(w.at_line_start for _n, _s, w in self._wrapped):
                return  # the script is in the middle of a line: wait for its end
            for _name, stream, _w in self._wrapped:
                stream.flush()  # its complete lines first, then the status under them
            show_status_line(text, self.terminal)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=2)
        with _print_lock:
            ended_mid_line = self.mid_line()
            for name, stream, wrapper in self._wrapped:
                if getattr(sys, name) is wrapper:  # the script may have replaced it since
                    setattr(sys, name, stream)
            erase_status_line(self.terminal)
            self.session.mid_line = None
            if self.session._held:  # the script ended in the middle of a line
                if ended_mid_line:
                    for _name, stream, _w in self._wrapped:
                        stream.flush()
                    self.terminal.write("\n")
                self.session.release_held()


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
