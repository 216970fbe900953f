"""`eval`: run code in the target's __main__ globals, like a REPL line.

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

_FILENAME = "<torchdoctor-eval>"


@dataclasses.dataclass
class EvalResult:
    output: str
    value: str | None = None
    error: str | None = None


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


def _main_namespace() -> dict[str, Any]:
    main = sys.modules.get("__main__")
    return main.__dict__ if main is not None else {}


def evaluate(code: str, namespace: dict[str, Any] | None = None) -> EvalResult:
    ns = _main_namespace() if namespace is None else namespace
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
        return EvalResult(buffer.getvalue(), shown)
    except KeyboardInterrupt:
        if threading.current_thread() is threading.main_thread():
            raise  # the user's Ctrl-C, come while the code ran on the training thread
        return EvalResult(buffer.getvalue(), None, "KeyboardInterrupt\n")
    except BaseException as exc:  # SystemExit in eval must not end the training either
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
        # Drop torchdoctor's own frames: the user wants the line of *their* code.
        kept = [line for line in tb if __file__ not in line]
        return EvalResult(buffer.getvalue(), None, "".join(kept))
    finally:
        for router in routers:
            router.captures.pop(me, None)


def _repr(value: Any, limit: int = 100_000) -> str:
    try:
        text = repr(value)
    except Exception as exc:
        text = f"<repr failed: {exc!r}>"
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"
