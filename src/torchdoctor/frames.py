"""Whose code a frame runs: the user's, or a library's (torch, the standard library, other
installed packages, torchdoctor itself). One test for every place that looks for "your line":
the call site of backward(), the op that made a NaN, where an OOM or a hang happened.

torchdoctor's demos count as the user's code: they stand in for a user's script.

A captured stack as data (`ThreadStack` of `StackFrame`s, innermost first) is what the hang
watchdog hands the diagnoses, what a rank tells its peers and what a finding's evidence keeps
(plain dataclasses: _json.py's codec writes and reads them).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import sysconfig
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import FrameType

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
DEMOS_DIR = os.path.join(PACKAGE_DIR, "demos") + os.sep
TORCH_PART = os.sep + "torch" + os.sep
_STDLIB = tuple(
    {sysconfig.get_paths()["stdlib"] + os.sep, os.path.join(sys.base_prefix, "lib") + os.sep}
)
_PACKAGES = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def is_own(path: str) -> bool:
    """torchdoctor's own code (its wrappers sit in the user's call stacks)."""
    return path.startswith(PACKAGE_DIR) and not path.startswith(DEMOS_DIR)


# The docstring of telemetry/as_caller.py's call, which runs from code moved to its caller's
# file and line (so that warnings name the caller): a traceback drops it as one of ours.
AS_CALLER = "torchdoctor: a call made as its caller's"


def is_own_code(code: Any) -> bool:
    """Code of torchdoctor's: in its files, or moved to a caller's by as_caller.py."""
    return is_own(code.co_filename) or code.co_consts[:1] == (AS_CALLER,)


def is_torch(path: str) -> bool:
    return TORCH_PART in path


def is_stdlib(path: str) -> bool:
    return path.startswith(_STDLIB) and not any(part in path for part in _PACKAGES)


def is_user_file(path: str) -> bool:
    """The user's own source: not generated (`<...>`), not torch, not the standard library, not
    an installed package, not torchdoctor."""
    if path.startswith("<") or is_own(path):
        return False
    if is_torch(path) or any(part in path for part in _PACKAGES):
        return False
    return not is_stdlib(path)


def is_library(path: str) -> bool:
    """torch's or torchdoctor's code, or generated code: never where the user should look."""
    return path.startswith("<") or is_own(path) or is_torch(path)


_KIND: dict[str, int] = {}  # file -> its file_kind
_USER, _OTHER, _LIBRARY = 2, 1, 0


def file_kind(path: str) -> int:
    """2: the user's file, 1: another library's (a trainer's), 0: torch's, torchdoctor's or
    generated code (user_frame's rule; the C++ collectives kernel asks it once per code
    object). Cached per file."""
    kind = _KIND.get(path)
    if kind is None:
        kind = _USER if is_user_file(path) else _LIBRARY if is_library(path) else _OTHER
        if len(_KIND) < 100_000:
            _KIND[path] = kind
    return kind


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The innermost frame from `frame` outwards that runs the user's code; failing that, the
    innermost one that is at least not torch's or torchdoctor's (a trainer library's line).
    Called on the hot path (every backward()): the test is cached per file."""
    fallback = None
    known = _KIND
    while frame is not None:
        path = frame.f_code.co_filename
        kind = known.get(path)
        if kind is None:
            kind = file_kind(path)
        if kind == _USER:
            return frame
        if fallback is None and kind == _OTHER:
            fallback = frame
        frame = frame.f_back
    return fallback


def caller_frame(frame: FrameType | None) -> tuple[FrameType | None, bool]:
    """(the innermost frame from `frame` outwards that is not torch's, torchdoctor's or
    generated: the code that called into torch; whether it is the user's code) or (None,
    False). Called on the hot path (every backward()): cached per file, and it stops at the
    first such frame where user_frame walks on to the user's (a launcher's line, under a trainer
    library)."""
    known = _KIND
    while frame is not None:
        path = frame.f_code.co_filename
        kind = known.get(path)
        if kind is None:
            kind = file_kind(path)
        if kind != _LIBRARY:
            return frame, kind == _USER
        frame = frame.f_back
    return None, False


def site(frame: FrameType | None) -> str | None:
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else None


def short_path(path: str) -> str:
    """`path` relative to the current directory when it lies under it, else as it is."""
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return path
    return path if rel.startswith("..") else rel


def short_site(site: str | None) -> str | None:
    """`file:line` with the file shortened as short_path does."""
    if not site:
        return site
    path, sep, line = site.rpartition(":")
    return f"{short_path(path)}:{line}" if sep else site


def drop_own_frames(tb: Any) -> Any:
    """The traceback `tb` without the entries of torchdoctor's wrappers that the error only
    passed through (the `backward()` wrapper between the user's line and torch's): a traceback
    printed under torchdoctor is the plain run's. An error raised in our own code keeps its
    frames. Returns the new head; the chain is edited in place (tb_next is writable)."""
    while tb is not None and tb.tb_next is not None and is_own_code(tb.tb_frame.f_code):
        tb = tb.tb_next
    entry = tb
    while entry is not None:
        after = entry.tb_next
        while (
            after is not None and after.tb_next is not None and is_own_code(after.tb_frame.f_code)
        ):
            after = after.tb_next
        if after is not entry.tb_next:
            entry.tb_next = after
        entry = after
    return tb


@dataclasses.dataclass(kw_only=True)
class StackFrame:
    """One frame of a captured stack: its function, file, line and that line's source."""

    func: str
    file: str
    lineno: int
    code: str | None = None

    @property
    def site(self) -> str:
        return f"{self.file}:{self.lineno}"


def first_user(frames: Iterable[StackFrame] | None) -> StackFrame | None:
    """The innermost frame of a captured stack (innermost first) that runs the user's code."""
    return next((f for f in frames or () if is_user_file(f.file)), None)


@dataclasses.dataclass(kw_only=True)
class ThreadStack:
    """One thread's captured stack, innermost frame first."""

    thread_id: int | None = None
    name: str
    is_main: bool = False
    daemon: bool = True
    frames: list[StackFrame] = dataclasses.field(default_factory=list)
