"""torch.compile events as rows of `python.compile`: every function compiled or recompiled
(with the guard that failed), every graph break (with its reason and the user's file:line), and
the recompile limit when dynamo gives up on a function.

How Dynamo is observed, without changing what the program does or prints:

- compilations: the CompilationMetrics record Dynamo makes for every frame it compiles
  (function, file, compile id, recompile reason, compile time). Dynamo hands each one to
  ``torch._utils_internal.log_compilation_event``, an INFO record on the logger
  ``torch._utils_internal``; a filter on that logger reads the record and drops it unless the
  logger would have let it through before (so nothing new is printed). As a fallback the
  records still in ``torch._dynamo.utils.get_compilation_metrics()`` are read at each compile
  start and on removal.
- where a compilation was triggered: Dynamo's on-compile-start callback
  (``torch._dynamo.callback``), which notes the first frame of the user's code on the stack.
- graph breaks: Dynamo's ``graph_breaks`` artifact loggers, which format the reason and the
  user's location only when enabled. They are enabled with propagation off and only our
  handler attached, so the message goes nowhere else; if the user enabled them (TORCH_LOGS)
  they are left as they are and only our handler is added.

Nothing is installed until the script imports torch._dynamo (torch.compile does), so a script
that never compiles pays nothing. Everything is undone by `CompileWatch.remove()`, and every
hook body is guarded: a failure switches this telemetry off, the training goes on.
"""

from __future__ import annotations

import collections
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchdoctor import frames
from torchdoctor._failsafe import Switch, warn_once
from torchdoctor.frames import is_stdlib, is_torch, is_user_file
from torchdoctor.identity import rank_from_env
from torchdoctor.telemetry.on_import import when_imported
from torchdoctor.telemetry.patches import Hooks

if TYPE_CHECKING:
    from torchdoctor.store.tables import Tables

StepSource = Callable[[], "int | None"]

_METRICS_LOGGER = "torch._utils_internal"
_GRAPH_BREAK_LOGGERS = (
    "torch._dynamo.symbolic_convert.__graph_breaks",
    "torch._dynamo.convert_frame.__graph_breaks",
    "torch._dynamo.exc.__graph_breaks",
)
_AT = re.compile(r"in user code at (?P<file>.+?):(?P<line>\d+)")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_LIMIT = re.compile(r"recompile.?limit|cache.?size.?limit", re.IGNORECASE)
MAX_DETAIL = 2000
MAX_PENDING = 1000


def parse_graph_break(message: str) -> dict[str, str | None]:
    """The user location, reason (one line), detail (explanation and hints) of a graph break
    as Dynamo's graph_breaks logger says it."""
    # The user's line: Dynamo's "in user code at" when it is the user's file, else the
    # innermost user frame of the traceback it prints. A break wholly inside torch's own code
    # (DDP's forward under compile) or another library has none: `location` stays None.
    location = None
    m = _AT.search(message)
    if m is not None and is_user_file(m.group("file")):
        location = f"{m.group('file')}:{m.group('line')}"
    else:
        stack = [(f.group("file"), f.group("line")) for f in _FRAME.finditer(message)]
        innermost = next((path for path, _ in reversed(stack) if not is_stdlib(path)), None)
        if innermost is None or not is_torch(innermost):
            users = [f"{path}:{line}" for path, line in stack if is_user_file(path)]
            location = users[-1] if users else None
    body = message.split("Graph Break Reason:", 1)[1] if "Graph Break Reason:" in message else ""
    body = re.split(r"User code traceback:|Stack variable source attribution:", body)[0]
    lines = [line.rstrip() for line in body.splitlines()]
    skipped = False
    while lines and (
        not lines[0].strip()
        or lines[0].strip().startswith(("Encountered graph", "Failed to handle"))
    ):
        skipped = skipped or lines[0].strip().startswith("Failed to handle")
        lines.pop(0)
    reason = lines[0].strip() if lines else None
    if reason is not None and skipped:
        reason += " (Dynamo gave up on the rest of the function: it runs uncompiled)"
    if reason is None and "skip" in message:
        reason = "a graph break Dynamo cannot resume from: the whole function runs uncompiled"
    detail = "\n".join(
        line.strip() for line in lines[1:] if line.strip().startswith(("Explanation:", "Hint:"))
    )
    code = re.search(r"/gb/(gb\d+)\.html", message)
    if code is not None:
        detail = f"{detail}\n{code.group(1)}".strip()
    return {"location": location, "reason": reason, "detail": detail[:MAX_DETAIL] or None}


def user_frame() -> str | None:
    """file:line of the innermost frame of the user's code on the current stack."""
    frame = frames.user_frame(sys._getframe(1))
    return (
        frames.site(frame)
        if frame is not None and frames.is_user_file(frame.f_code.co_filename)
        else None
    )


class _MetricsFilter(logging.Filter):
    """Reads Dynamo's CompilationMetrics records; lets a record through only if the logger
    would have emitted it without us."""

    def __init__(self, watch: CompileWatch, threshold: int) -> None:
        super().__init__("torchdoctor")
        self.watch = watch
        self.threshold = threshold

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args and type(args[0]).__name__ == "CompilationMetrics":
            self.watch.on_metrics(args[0])
        return record.levelno >= self.threshold


class _GraphBreakHandler(logging.Handler):
    def __init__(self, watch: CompileWatch) -> None:
        super().__init__(logging.DEBUG)
        self.watch = watch

    def emit(self, record: logging.LogRecord) -> None:
        self.watch.on_graph_break(record)


class CompileWatch:
    """The handle `install` returns; `remove()` undoes everything."""

    def __init__(self, tables: Tables, step_source: StepSource, rank: int | None = None) -> None:
        self.table = tables["compile"]
        self.step_source = step_source
        self.rank = rank_from_env() if rank is None else rank
        self.switch = Switch("compile telemetry")
        self.hooks = Hooks()
        self.attached = False
        self._counts: collections.Counter[tuple[Any, ...]] = collections.Counter()
        self._callsites: dict[str, str | None] = {}
        self._pending: dict[str, list[dict[str, Any]]] = {}  # graph breaks awaiting their function
        self._seen: set[tuple[Any, ...]] = set()
        self._frames: dict[str, tuple[str | None, str | None]] = {}  # frame id -> function, code
        self._lock = threading.Lock()

    # -- life cycle --------------------------------------------------------------------------
    def install(self) -> CompileWatch:
        self.hooks.on_remove(when_imported("torch._dynamo", self._attach))
        return self

    def remove(self) -> None:
        try:
            if self.attached:
                self._poll()
                self._flush_pending()
        except Exception as exc:
            warn_once("compile-telemetry-flush", f"compile telemetry: {exc}")
        self.hooks.remove()
        self.attached = False

    def _attach(self, _module: Any) -> None:
        try:
            self._attach_callbacks()
            self._attach_metrics()
            self._attach_graph_breaks()
            self.attached = True
        except Exception as exc:
            self.hooks.remove()
            warn_once("compile-telemetry", f"torch.compile telemetry is off: {exc}")

    def _attach_callbacks(self) -> None:
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self._on_start)
        self.hooks.on_remove(lambda: callback_handler.remove_start_callback(self._on_start))

    def _attach_metrics(self) -> None:
        logger = logging.getLogger(_METRICS_LOGGER)
        level = logger.level
        threshold = logger.getEffectiveLevel()
        if threshold > logging.INFO:
            logger.setLevel(logging.INFO)
        flt = _MetricsFilter(self, threshold)
        logger.addFilter(flt)

        def undo() -> None:
            logger.removeFilter(flt)
            if logger.level == logging.INFO and threshold > logging.INFO:
                logger.setLevel(level)

        self.hooks.on_remove(undo)

    def _attach_graph_breaks(self) -> None:
        handler = _GraphBreakHandler(self)
        for name in _graph_break_loggers():
            logger = logging.getLogger(name)
            level, propagate = logger.level, logger.propagate
            ours = not logger.isEnabledFor(logging.DEBUG)
            if ours:  # enabled for us alone: nothing reaches torch's handlers or the root
                logger.setLevel(logging.DEBUG)
                logger.propagate = False
            logger.addHandler(handler)

            def undo(
                logger: logging.Logger = logger,
                level: int = level,
                p: bool = propagate,
                ours: bool = ours,
            ) -> None:
                logger.removeHandler(handler)
                # Restore only what is still ours: the user may have called set_logs since.
                if ours and logger.level == logging.DEBUG and not logger.propagate:
                    logger.setLevel(level)
                    logger.propagate = p

            self.hooks.on_remove(undo)

    # -- Dynamo's side ----------------------------------------------------------------------
    def _on_start(self, args: Any) -> None:
        if not self.switch.on:
            return
        try:
            compile_id = str(getattr(args, "compile_id", "") or "")
            if len(self._callsites) > MAX_PENDING:
                self._callsites.clear()
            self._callsites[compile_id] = user_frame()
            self._poll()
        except Exception as exc:
            self.switch.fail(exc)

    def on_metrics(self, metrics: Any) -> None:
        if not self.switch.on:
            return
        try:
            self._record_metrics(metrics)
        except Exception as exc:
            self.switch.fail(exc)

    def on_graph_break(self, record: logging.LogRecord) -> None:
        if not self.switch.on:
            return
        try:
            parsed = parse_graph_break(record.getMessage())
            compile_id = _current_compile_id()
            pending = {
                **parsed,
                "compile_id": compile_id,
                "time": time.time(),
                "step": self._step(),
            }
            with self._lock:
                rows = self._pending.setdefault(compile_id or "", [])
                if len(rows) < MAX_PENDING:
                    rows.append(pending)
        except Exception as exc:
            self.switch.fail(exc)

    # -- rows -------------------------------------------------------------------------------
    def _step(self) -> int | None:
        try:
            step = self.step_source()
        except Exception:
            return None
        return int(step) if step is not None else None

    def _poll(self) -> None:
        """Metrics the logger did not hand over (a torch whose Dynamo does not log them)."""
        from torch._dynamo.utils import get_compilation_metrics

        for metrics in get_compilation_metrics():
            self._record_metrics(metrics)

    def _record_metrics(self, m: Any) -> None:
        compile_id = str(getattr(m, "compile_id", "") or "")
        key = (compile_id, getattr(m, "start_time_us", None), getattr(m, "fail_reason", None))
        with self._lock:
            if key in self._seen or getattr(m, "is_runtime", False):
                return
            if getattr(m, "is_forward", True) is False:
                return  # the backward graph of a compile already recorded
            self._seen.add(key)
        function = getattr(m, "co_name", None)
        code = None
        if getattr(m, "co_filename", None):
            code = f"{m.co_filename}:{getattr(m, 'co_firstlineno', '?')}"
        # a diagnosis module: loaded once something compiles, not with the telemetry
        from torchdoctor.diagnose.recompilation import frame_id

        frame = frame_id(compile_id)
        if frame is not None:
            if function or code:
                self._frames[frame] = (function, code)
            else:  # the recompile-limit record names no function: its frame's earlier ones do
                function, code = self._frames.get(frame, (None, None))
        fail = str(getattr(m, "fail_reason", "") or "")
        reason = getattr(m, "recompile_reason", None)
        if fail and _LIMIT.search(fail):
            kind = "recompile_limit"
            reason = reason or fail.splitlines()[0]
        elif fail and not getattr(m, "has_guarded_code", True):
            kind = None  # a frame Dynamo skipped: its graph break row says why
        elif reason or (getattr(m, "cache_size", 0) or 0) > 0:
            kind = "recompile"
        else:
            kind = "compile"
        duration = getattr(m, "entire_frame_compile_time_s", None)
        location = self._callsites.pop(compile_id, None)
        self._flush_pending(compile_id, function, code)
        if kind is None:
            return
        self._append(kind, function, code, location, reason, None, compile_id, duration)

    def _flush_pending(
        self, compile_id: str | None = None, function: str | None = None, code: str | None = None
    ) -> None:
        """Graph breaks of a compilation, once its function is known (or on removal)."""
        with self._lock:
            if compile_id is None:
                batches = list(self._pending.values())
                self._pending.clear()
            else:
                batches = [self._pending.pop(compile_id, [])]
        for rows in batches:
            for r in rows:
                self._append(
                    "graph_break",
                    function,
                    code,
                    r["location"],
                    r["reason"],
                    r["detail"],
                    r["compile_id"],
                    None,
                    when=r["time"],
                    step=r["step"],
                )

    def _append(
        self,
        kind: str,
        function: str | None,
        code: str | None,
        location: str | None,
        reason: str | None,
        detail: str | None,
        compile_id: str | None,
        duration: float | None,
        when: float | None = None,
        step: int | None = None,
    ) -> None:
        from torchdoctor.diagnose.recompilation import normalise

        key = (kind, code, location, normalise(reason))
        with self._lock:
            self._counts[key] += 1
            count = self._counts[key]
        self.table.append(
            (
                time.time() if when is None else when,
                self._step() if when is None else step,
                self.rank,
                kind,
                function,
                code,
                location,
                _clip(reason),
                detail,
                compile_id,
                count,
                duration,
            )
        )


def _clip(text: str | None) -> str | None:
    if text is None:
        return None
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."


def _current_compile_id() -> str | None:
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
    except Exception:
        return None
    return str(cid) if cid is not None else None


def _graph_break_loggers() -> list[str]:
    try:
        from torch._logging._internal import log_registry

        names = [n for n in log_registry.get_artifact_log_qnames() if n.endswith("__graph_breaks")]
    except Exception:
        names = []
    return sorted(set(names) | set(_GRAPH_BREAK_LOGGERS))


def install(tables: Tables, step_source: StepSource, rank: int | None = None) -> CompileWatch:
    """Start recording torch.compile events into tables["compile"]; `step_source()` gives the
    step in progress. Returns the handle whose remove() undoes it all."""
    return CompileWatch(tables, step_source, rank).install()
