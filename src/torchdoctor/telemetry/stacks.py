"""Stacks and threads of the live process, read from any thread (the main one may be stuck)."""

from __future__ import annotations

import linecache
import os
import sys
import threading
from types import FrameType
from typing import Any

from torchdoctor.frames import PACKAGE_DIR, StackFrame, ThreadStack

PROBE_THREAD_PREFIX = "torchdoctor-"
_RUNNER = os.path.join(PACKAGE_DIR, "cli") + os.sep  # `torchdoctor run`, under the script


def _thread_names() -> dict[int, threading.Thread]:
    return {t.ident: t for t in threading.enumerate() if t.ident is not None}


def _is_probe(thread: threading.Thread | None) -> bool:
    return thread is not None and thread.name.startswith(PROBE_THREAD_PREFIX)


def frames_of(frame: FrameType | None, limit: int = 200) -> list[FrameType]:
    """A thread's frames, innermost first."""
    out: list[FrameType] = []
    while frame is not None and len(out) < limit:
        out.append(frame)
        frame = frame.f_back
    return out


def user_frames(frames: list[FrameType]) -> list[FrameType]:
    """Frames innermost first, without the frames of `torchdoctor run` that started the script
    (its CLI, runpy): the stack reads as it would under `python train.py`."""
    for i, frame in enumerate(frames):
        if frame.f_code.co_filename.startswith(_RUNNER):
            kept = frames[:i]
            while kept and "runpy" in kept[-1].f_code.co_filename:
                kept.pop()
            return kept
    return frames


def source_line(filename: str, lineno: int) -> str | None:
    line = linecache.getline(filename, lineno)
    return line.strip() or None


def backtrace_rows(include_probe: bool = False) -> list[tuple[Any, ...]]:
    """python.backtrace rows: every frame of every thread, innermost first."""
    threads = _thread_names()
    main_id = threading.main_thread().ident
    me = threading.get_ident()
    rows = []
    for tid, top in sys._current_frames().items():
        thread = threads.get(tid)
        if tid == me or (not include_probe and _is_probe(thread)):
            continue
        name = thread.name if thread is not None else f"thread-{tid}"
        for depth, frame in enumerate(user_frames(frames_of(top))):
            code = frame.f_code
            rows.append(
                (
                    tid,
                    name,
                    depth,
                    code.co_name,
                    code.co_filename,
                    frame.f_lineno,
                    source_line(code.co_filename, frame.f_lineno or 0),
                    tid == main_id,
                )
            )
    rows.sort(key=lambda r: (not r[7], r[0], r[2]))
    return rows


def thread_rows() -> list[tuple[Any, ...]]:
    """python.threads rows."""
    threads = _thread_names()
    main_id = threading.main_thread().ident
    rows = []
    for tid in set(threads) | set(sys._current_frames()):
        thread = threads.get(tid)
        rows.append(
            (
                tid,
                thread.name if thread is not None else f"thread-{tid}",
                bool(thread.daemon) if thread is not None else True,
                thread.is_alive() if thread is not None else True,
                tid == main_id,
                _is_probe(thread),
            )
        )
    rows.sort(key=lambda r: (not r[4], r[1]))
    return rows


def capture_all(limit: int = 64) -> list[ThreadStack]:
    """Every thread's stack (torchdoctor's own left out), innermost frame first."""
    threads = _thread_names()
    main_id = threading.main_thread().ident
    out = []
    for tid, top in sys._current_frames().items():
        thread = threads.get(tid)
        if _is_probe(thread):
            continue
        frames = []
        for frame in user_frames(frames_of(top, limit)):
            code = frame.f_code
            lineno = frame.f_lineno or 0
            frames.append(
                StackFrame(
                    func=code.co_name,
                    file=code.co_filename,
                    lineno=lineno,
                    code=source_line(code.co_filename, lineno),
                )
            )
        out.append(
            ThreadStack(
                thread_id=tid,
                name=thread.name if thread is not None else f"thread-{tid}",
                is_main=tid == main_id,
                daemon=bool(thread.daemon) if thread is not None else True,
                frames=frames,
            )
        )
    out.sort(key=lambda t: not t.is_main)
    return out
