"""Where `eval` finds its names. Most training scripts keep the model and the optimizer in the
locals of `main()` (or of a `train()` it calls), not in `__main__`'s globals: a name that is
not a global of `__main__` is looked up in the locals of the training thread's own frames, the
innermost first, and the answer says which frame gave it. `--frame FUNC|N` makes one frame's
locals the first place to look, as a debugger's `frame` command does.

At a step boundary the eval runs on the training thread, inside the step-end hook: the
training loop's frames are the callers of that hook (the user's frame that called
`optimizer.step()`, then its callers). On the probe's thread (`--at now`, a stuck run) they
are the training thread's frames as `sys._current_frames()` sees them.

Frames are only read, never written (no assignment to `f_locals`): what the code assigns goes
to `__main__`'s globals, as before. The frames are let go once the code has run, so a function
the code defines does not keep a finished frame (and its tensors) alive.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from typing import TYPE_CHECKING, Any

from torchdoctor.frames import is_user_file, short_path

if TYPE_CHECKING:
    from types import FrameType

EVAL_FILENAME = "<torchdoctor-eval>"


class NoSuchFrame(Exception):
    """`--frame` named a frame the training thread does not have."""


@dataclasses.dataclass
class UserFrame:
    func: str
    file: str
    line: int
    frame: FrameType  # the live frame object; dropped by Scope.release()

    @property
    def label(self) -> str:
        return frame_label(self.func, self.file, self.line)


def frame_label(func: str, file: str, line: int) -> str:
    """`main() at train.py:81`; a module's top level is `train.py:12`."""
    where = f"{short_path(file)}:{line}"
    return where if func == "<module>" else f"{func}() at {where}"


def thread_frame(thread_id: int | None) -> Any:
    """The innermost frame of `thread_id` (None: the main thread), seen from another thread."""
    if thread_id is None:
        thread_id = threading.main_thread().ident
    return sys._current_frames().get(thread_id)  # type: ignore[arg-type]


def user_frames(thread_id: int | None) -> list[UserFrame]:
    """The user's frames of `thread_id` (None: the main thread), innermost first: from the
    caller when that is the thread asking, else from sys._current_frames()."""
    if thread_id is None:
        thread_id = threading.main_thread().ident
    here = thread_id == threading.get_ident()
    frame = sys._getframe(1) if here else thread_frame(thread_id)
    out = []
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename) and code.co_name != "<module>":
            out.append(UserFrame(code.co_name, code.co_filename, frame.f_lineno, frame))
        frame = frame.f_back
    return out


def choose(frames: list[UserFrame], choice: str) -> UserFrame:
    """The frame `choice` names: its index among `frames` (0 = innermost) or its function."""
    if choice.isdigit() and int(choice) < len(frames):
        return frames[int(choice)]
    for frame in frames:
        if frame.func == choice:
            return frame
    listing = "; ".join(f"{i} {f.label}" for i, f in enumerate(frames)) or "none"
    raise NoSuchFrame(
        f"no frame {choice!r} in the training thread's stack; its frames (--frame N or "
        f"--frame FUNCTION): {listing}"
    )


class Scope(dict[str, Any]):
    """The namespace the code runs in. Reads: the chosen frame's locals (with --frame), then
    `__main__`'s globals, then the locals of the training thread's frames, innermost first.
    Writes and deletes go to `__main__`'s globals. Used as the globals of exec/eval, so the
    code's comprehensions, lambdas and functions see the same names."""

    def __init__(
        self, main: dict[str, Any], frames: list[UserFrame], chosen: UserFrame | None
    ) -> None:
        super().__init__()
        self._main = main
        self._frames = frames
        self._chosen = chosen
        self.answered: dict[str, str] = {}  # name -> label of the frame that gave it

    def __missing__(self, name: str) -> Any:
        chosen = self._chosen
        if chosen is not None:
            local = _local(chosen, name)
            if local is not _ABSENT:
                self.answered.setdefault(name, chosen.label)
                return local
        if name in self._main:
            return self._main[name]
        if chosen is not None and name in chosen.frame.f_globals:
            return chosen.frame.f_globals[name]
        for frame in self._frames:
            local = _local(frame, name)
            if local is not _ABSENT:
                self.answered.setdefault(name, frame.label)
                return local
        raise KeyError(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self._main[name] = value

    def __delitem__(self, name: str) -> None:
        del self._main[name]

    def searched(self) -> str:
        """Where a name was looked for, for a NameError."""
        places = ["__main__'s globals"] + [f.label for f in self._frames]
        return "; ".join(places)

    def release(self) -> None:
        """Let the frames go; what the code stored straight into this dict (a `global`
        statement inside a function it defined) goes to __main__ too."""
        for name, value in list(dict.items(self)):
            if name != "__builtins__":
                self._main[name] = value
        self._frames = []
        self._chosen = None


_ABSENT = object()


def _local(frame: UserFrame, name: str) -> Any:
    # f_locals is read, never written; a frame that finished meanwhile still has its locals
    return frame.frame.f_locals.get(name, _ABSENT)


def main_globals() -> dict[str, Any]:
    main = sys.modules.get("__main__")
    return main.__dict__ if main is not None else {}
