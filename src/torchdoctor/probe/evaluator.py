"""`eval`: run code in the target's __main__ globals, like a REPL line; a name that is not a
global of __main__ comes from the training thread's frames (probe/eval_scope.py).

What the code prints is captured for the calling thread only: the training thread keeps
printing to its own stdout meanwhile. A final expression's value is returned as its repr. An
exception comes back as its traceback; the training goes on.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import sys
import threading
import traceback
from typing import Any, TextIO

from torchdoctor.probe.eval_scope import (
    EVAL_FILENAME,
    NoSuchFrame,
    Scope,
    choose,
    main_globals,
    user_frames,
)

_FILENAME = EVAL_FILENAME


@dataclasses.dataclass
class EvalResult:
    output: str
    value: str | None = None
    error: str | None = None
    names: dict[str, str] = dataclasses.field(default_factory=dict)  # name -> frame that gave it

    def frames(self) -> list[dict[str, Any]]:
        """The frames that answered, each with the names it gave, in the order first used."""
        by_frame: dict[str, list[str]] = {}
        for name, label in self.names.items():
            by_frame.setdefault(label, []).append(name)
        return [{"frame": label, "names": names} for label, names in by_frame.items()]


class _ThreadRouter(io.TextIOBase):
    """Stands in for sys.stdout/stderr: writes from a capturing thread go to its buffer."""

    def __init__(self, original: TextIO) -> None:
        self.original = original
        self.captures: dict[int, io.StringIO] = {}

    def _target(self) -> TextIO:
        return self.captures.get(threading.get_ident()) or self.original

    def write(self, s: str) -> int:
        return self._target().write(s)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return self._target().isatty()

    def fileno(self) -> int:
        return self.original.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


_install_lock = threading.Lock()


def _router(stream_name: str) -> _ThreadRouter:
    with _install_lock:
        current = getattr(sys, stream_name)
        if isinstance(current, _ThreadRouter):
            return current
        router = _ThreadRouter(current)
        setattr(sys, stream_name, router)
        return router


def evaluate(
    code: str,
    namespace: dict[str, Any] | None = None,
    thread_id: int | None = None,
    frame: str | None = None,
) -> EvalResult:
    """Run `code` in `namespace`, or by default in __main__'s globals with the locals of
    thread `thread_id`'s frames (the training thread; None: the main thread) behind them,
    `frame` (a function name or an index, 0 = innermost) first."""
    scope: Scope | None = None
    if namespace is None:
        frames = user_frames(thread_id)
        try:
            chosen = choose(frames, frame) if frame else None
        except NoSuchFrame as exc:
            return EvalResult("", None, f"{exc}\n")
        scope = Scope(main_globals(), frames, chosen)
        ns: dict[str, Any] = scope
    else:
        ns = namespace
    try:
        return _run(code, ns, scope)
    finally:
        if scope is not None:
            scope.release()


def _run(code: str, ns: dict[str, Any], scope: Scope | None) -> EvalResult:
    buffer = io.StringIO()
    me = threading.get_ident()
    routers = [_router("stdout"), _router("stderr")]
    for router in routers:
        router.captures[me] = buffer
    try:
        tree = ast.parse(code, _FILENAME, "exec")
        last = tree.body[-1] if tree.body else None
        value: Any = None
        if isinstance(last, ast.Expr):
            tree.body.pop()
            exec(compile(tree, _FILENAME, "exec"), ns)
            value = eval(compile(ast.Expression(last.value), _FILENAME, "eval"), ns)
        else:
            exec(compile(tree, _FILENAME, "exec"), ns)
        shown = None if value is None else _repr(value)
        return EvalResult(buffer.getvalue(), shown, names=_answered(scope))
    except KeyboardInterrupt:
        if threading.current_thread() is threading.main_thread():
            raise  # the user's Ctrl-C, come while the code ran on the training thread
        return EvalResult(buffer.getvalue(), None, "KeyboardInterrupt\n")
    except BaseException as exc:  # SystemExit in eval must not end the training either
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        # Drop torchdoctor's own frames: the user wants the line of *their* code.
        kept = [line for line in tb if __file__ not in line]
        if isinstance(exc, NameError) and scope is not None:
            kept.append(f"(looked in: {scope.searched()})\n")
        return EvalResult(buffer.getvalue(), None, "".join(kept), _answered(scope))
    finally:
        for router in routers:
            router.captures.pop(me, None)


def _answered(scope: Scope | None) -> dict[str, str]:
    return dict(scope.answered) if scope is not None else {}


def _repr(value: Any, limit: int = 100_000) -> str:
    try:
        text = repr(value)
    except Exception as exc:
        text = f"<repr failed: {exc!r}>"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"
