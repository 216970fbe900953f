"""torchdoctor in Jupyter and IPython: `%load_ext torchdoctor`.

Loading the extension starts the probe in the kernel (options from the TORCHDOCTOR_*
variables; `%torchdoctor start --run-dir DIR ...` for others) and adds one magic:

    %torchdoctor status [--format json]              the probe: run directory, step, loss, ...
    %torchdoctor diagnoses [RUN_DIR] [--format json] problems found, with evidence and fixes
    %torchdoctor query [RUN_DIR] [--format table|json|csv] SQL
    %%torchdoctor query [RUN_DIR] [--format ...]     (the cell holds the SQL)
    %torchdoctor report [RUN_DIR] [-o FILE]          the HTML report, written and shown inline
    %torchdoctor start [OPTIONS] | stop

Without RUN_DIR they read this kernel's own probe. A kernel waits for its user between cells;
that is not a hang, so the hang watchdog stands down between cells (`watch_cells`, also done
by torchdoctor.start() in a kernel).
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import HTML, display

from torchdoctor import session as sessions
from torchdoctor._json import clean, dumps
from torchdoctor.config import ConfigError, add_arguments, from_args
from torchdoctor.diagnose.record import Finding
from torchdoctor.integrations.report import REPORT_FILE, write_report
from torchdoctor.integrations.saved_run import open_recorded
from torchdoctor.report import formats, renderer
from torchdoctor.report.notebook import QueryTable, inline_page
from torchdoctor.report.tabular import FORMATS, render
from torchdoctor.sql.engine import SqlEngine, SqlError
from torchdoctor.store.saved import RunNotFound

USAGE = "usage: %torchdoctor status|diagnoses|query|report|start|stop [ARGS]"
_watched: set[int] = set()  # shells whose cells are watched (id of the shell)


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext torchdoctor`: start the probe, watch cells, add the magic (idempotent)."""
    ipython.register_magics(TorchdoctorMagics)  # registering again replaces, never doubles
    if sessions.current() is None:
        sessions.start()
    watch_cells(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    if id(ipython) in _watched:
        ipython.events.unregister("pre_run_cell", _cell_starts)
        ipython.events.unregister("post_run_cell", _cell_ends)
        _watched.discard(id(ipython))


def watch_cells(shell: Any) -> None:
    """Tell the probe when a cell runs, so that time between cells is not taken for a hang."""
    if shell is None or id(shell) in _watched:
        return
    shell.events.register("pre_run_cell", _cell_starts)
    shell.events.register("post_run_cell", _cell_ends)
    _watched.add(id(shell))


def current_shell() -> Any:
    """The running IPython shell (kernel or terminal), or None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _cell_starts(info: Any) -> None:
    current = sessions.current()
    if current is not None:
        current.set_waiting(False)
        if current.telemetry is not None:
            # A cell run again trains new objects while the old ones may live on (Out[n]).
            current.telemetry.rediscover()


def _cell_ends(result: Any) -> None:
    current = sessions.current()
    if current is not None:
        current.set_waiting(True)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise UsageError(f"{self.prog}: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> Any:
        raise UsageError(message or self.format_usage())


@magics_class
class TorchdoctorMagics(Magics):
    @line_cell_magic
    def torchdoctor(self, line: str, cell: str | None = None) -> None:
        verb, _, rest = line.strip().partition(" ")
        handler = {
            "status": self._status,
            "diagnoses": self._diagnoses,
            "query": self._query,
            "report": self._report,
            "start": self._start,
            "stop": self._stop,
        }.get(verb)
        if handler is None:
            raise UsageError(f"{USAGE}\n(got {verb!r})" if verb else USAGE)
        if cell is not None and verb != "query":
            raise UsageError("only `%%torchdoctor query` takes a cell (the SQL)")
        if verb == "query":
            self._query(rest, cell)
        else:
            handler(rest)

    # -- verbs -------------------------------------------------------------------------------
    def _start(self, rest: str) -> None:
        parser = _Parser(prog="%torchdoctor start")
        add_arguments(parser)
        parser.add_argument("--quiet", action="store_true")
        args = parser.parse_args(shlex.split(rest))
        running = sessions.current()
        if running is not None:
            print(f"torchdoctor is already running here; run directory {running.run_dir}")
            return
        try:
            started = sessions.start(from_args(args))
        except ConfigError as exc:
            raise UsageError(f"%torchdoctor start: {exc}") from None
        watch_cells(self.shell)
        print(f"torchdoctor: probing pid {started.pid}; run directory {started.run_dir}")

    def _stop(self, rest: str) -> None:
        running = sessions.current()
        if running is None:
            print("torchdoctor is not running here")
            return
        running.stop()
        print(f"torchdoctor stopped; the run is saved in {running.run_dir}")

    def _status(self, rest: str) -> None:
        parser = _Parser(prog="%torchdoctor status")
        formats.add(parser, formats.REPORT)
        args = parser.parse_args(shlex.split(rest))
        status = clean(_live().status())
        if args.format == "json":
            print(dumps(status, indent=2))
            return
        lines = [f"torchdoctor: pid {status['pid']}, run directory {status['run_dir']}"]
        if status.get("step") is not None:
            lines.append(
                f"  steps {status['step']}, loss {status.get('loss')}, "
                f"step time {status.get('step_time')} s"
            )
        else:
            lines.append("  no optimizer step seen yet")
        for key in ("tcp", "metrics"):
            if status.get(key):
                lines.append(f"  {key}: {status[key]}")
        print("\n".join(lines))

    def _diagnoses(self, rest: str) -> None:
        parser = _Parser(prog="%torchdoctor diagnoses")
        parser.add_argument("run_dir", nargs="?")
        formats.add(parser, formats.REPORT)
        args = parser.parse_args(shlex.split(rest))
        if args.run_dir is not None:
            run = _saved(args.run_dir)
            rows = run.block("diagnoses").to_records()

            def steps() -> int:
                return int(run.block("steps").rows)
        else:
            sql = _live().sql
            result = sql.execute("SELECT * FROM python.diagnoses ORDER BY time")
            rows = [dict(zip(result.columns, row, strict=True)) for row in result.rows]

            def steps() -> int:
                return int(sql.execute("SELECT count(*) FROM python.steps").rows[0][0])

        findings = [Finding.from_row(r) for r in rows]
        print(renderer.render_judged(renderer.of(args.format), findings, steps))

    def _query(self, rest: str, cell: str | None = None) -> None:
        fmt, run_dir, sql = _split_query(rest)
        if cell is not None:
            if sql:
                raise UsageError("%%torchdoctor query: give the SQL in the cell, not on the line")
            sql = cell
        if not sql.strip():
            raise UsageError("%torchdoctor query [RUN_DIR] [--format table|json|csv] SQL")
        engine = SqlEngine(_saved(run_dir)) if run_dir else _live().sql
        try:
            result = engine.execute(sql)
        except SqlError as exc:
            raise UsageError(f"query failed: {exc}") from None
        finally:
            if run_dir:
                engine.close()
        if fmt == "table":
            display(QueryTable(result.columns, result.rows))
        else:
            print(render(result.columns, result.rows, fmt))
        if result.truncated:
            print(f"torchdoctor: only the first {len(result.rows)} rows are shown; add a LIMIT")

    def _report(self, rest: str) -> None:
        parser = _Parser(prog="%torchdoctor report")
        parser.add_argument("run_dir", nargs="?")
        parser.add_argument("-o", "--output", metavar="FILE")
        args = parser.parse_args(shlex.split(rest))
        if args.run_dir is not None:
            source = Path(args.run_dir)
            _saved(args.run_dir)  # the clear error first
        else:
            live = _live()
            live.flush()  # the page shows everything recorded up to now
            source = Path(live.run_dir)
        output = Path(args.output) if args.output else source / REPORT_FILE
        try:
            path = write_report(source, output)
        except RunNotFound as exc:
            raise UsageError(str(exc)) from None
        except OSError as exc:
            raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None
        display(HTML(inline_page(path.read_text(encoding="utf-8"))))
        print(f"torchdoctor: report written to {path}")


def _live() -> Any:
    current = sessions.current()
    if current is None:
        raise UsageError(
            "torchdoctor is not running in this kernel: `%torchdoctor start` or "
            "torchdoctor.start() (or give a RUN_DIR)"
        )
    return current


def _saved(run_dir: str) -> Any:
    try:
        return open_recorded(run_dir)
    except RunNotFound as exc:
        raise UsageError(str(exc)) from None


_FORMAT = re.compile(r"^--format(?:=|\s+)(\S+)\s*")


def _split_query(rest: str) -> tuple[str, str | None, str]:
    """`[--format F] [RUN_DIR] [--format F] SQL` -> (format, run_dir, sql); the SQL is kept
    verbatim (no shell-style splitting: its quotes are SQL's). A RUN_DIR is a first word that
    looks like a path, which SQL never does."""
    fmt, run_dir, text = "table", None, rest.strip()
    for _ in range(3):
        m = _FORMAT.match(text)
        if m:
            fmt, text = m.group(1), text[m.end() :]
            continue
        word = text.split(None, 1)[0] if text else ""
        if run_dir is None and (word.startswith(("/", ".", "~")) or "/" in word):
            run_dir = str(Path(word).expanduser())
            text = text[len(word) :].lstrip()
            continue
        break
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    return fmt, run_dir, text
