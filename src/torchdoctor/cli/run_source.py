"""A run to read with SQL, whether saved (a run or job directory) or live (an endpoint): the
one place where `report` and `compare` open what they were given.

A saved run answers through DuckDB over its files; a live process through its query route. Both
give `execute(sql) -> (columns, rows)`, the run's meta and the warnings met while reading it.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchdoctor.cli.errors import CliError

if TYPE_CHECKING:
    from torchdoctor.cli.client import ProbeClient
    from torchdoctor.cli.context import Context
    from torchdoctor.store.saved import JobRun, SavedRun

Execute = Callable[[str], tuple[list[str], list[Any]]]


class SourceError(Exception):
    """The run could not answer a query (the message is its own): exit 1."""


@dataclasses.dataclass
class RunSource:
    label: str  # as the user named it
    execute: Execute
    meta: dict[str, Any]
    warnings: list[str]
    run: SavedRun | JobRun | None = None  # of a saved run
    run_dir: Path | None = None  # where its files are (a live process's too, on this machine)

    @property
    def live(self) -> bool:
        return self.run is None


def is_endpoint(text: str) -> bool:
    """A pid, a socket file or HOST:PORT, rather than a directory."""
    if os.path.isdir(text):
        return False
    if text.isdigit():
        return True
    try:
        if stat.S_ISSOCK(os.stat(text).st_mode):
            return True
    except OSError:
        pass
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit())


def open_source(text: str, ctx: Context, token: str | None = None) -> RunSource:
    """A saved run or job directory, or (for a pid, socket or HOST:PORT) a live process."""
    if is_endpoint(text):
        from torchdoctor.cli.client import DEFAULT_TIMEOUT, ProbeClient
        from torchdoctor.cli.endpoint import resolve

        wait = (ctx.timeout + 5.0) if ctx.timeout else DEFAULT_TIMEOUT
        return live(ProbeClient(resolve(text, token or ctx.token), wait), ctx, text)
    return saved(text, ctx)


def saved(source: str, ctx: Context) -> RunSource:
    from torchdoctor.cli.saved import open_saved
    from torchdoctor.sql.engine import SqlEngine, SqlError
    from torchdoctor.store.saved import RunNotFound

    run = open_saved(source, ctx)
    try:
        recorded = run.recorded()
    except OSError as exc:
        raise CliError(f"cannot read {source}: {exc.strerror or exc}") from None
    if not recorded:
        raise CliError(f"{source}: nothing was recorded there (no steps, no diagnoses)")
    engine = SqlEngine(run)

    def execute(sql: str) -> tuple[list[str], list[Any]]:
        try:
            result = engine.execute(sql, timeout=ctx.timeout)
        except SqlError as exc:
            raise SourceError(str(exc)) from None
        except RunNotFound as exc:
            raise CliError(str(exc)) from None
        return result.columns, result.rows

    # a job: its first rank's files (meta.json, the script's copy) stand for it
    meta = dict(run.meta)
    run_dir = Path(source)
    if hasattr(run, "rank_run"):
        first = run.rank_run(run.ranks[0])
        run_dir = first.path
        meta = {**first.meta, **meta}  # how the job was started: as its first rank was
    return RunSource(source, execute, meta, list(run.warnings), run, run_dir)


def live(client: ProbeClient, ctx: Context, label: str | None = None) -> RunSource:
    from torchdoctor.store import rundir

    _status, meta = client.request("GET", "/v1/status")

    def execute(sql: str) -> tuple[list[str], list[Any]]:
        status, payload = client.request("POST", "/v1/query", {"sql": sql, "timeout": ctx.timeout})
        if status != 200:
            raise SourceError(str(payload.get("error")))
        return list(payload["columns"]), list(payload["rows"])

    meta = dict(meta)
    run_dir = Path(meta["run_dir"]) if meta.get("run_dir") else None
    if run_dir is not None and (run_dir / rundir.META_FILE).exists():
        # the process's meta.json, on this machine: how it was started (environment, script)
        recorded = rundir.read_meta(run_dir)
        meta = {**recorded, **{k: v for k, v in meta.items() if k not in recorded}}
    name = label or str(ctx.endpoint or f"process {meta.get('pid')}")
    return RunSource(name, execute, meta, [], None, run_dir)
