"""Prometheus metrics: what `--metrics HOST:PORT` serves at /metrics.

The numbers come from the same tables SQL reads (the latest `python.steps` row of each rank,
sums over the steps kept, `python.diagnoses` counted by kind and severity), so a live process
and a saved run or job directory (`torchdoctor metrics RUN_DIR`) give the same families.
Rendering the text format is report/prometheus.py's job.

The server is the probe's: daemon threads, the token checked in constant time before any
routing (401), unless the user left a loopback address open with `--metrics-open`. A scrape
reads table snapshots on its request thread; the training thread does nothing for it.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
from http.server import HTTPServer
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import numpy as np

from torchdoctor._failsafe import warn_once
from torchdoctor._version import __version__
from torchdoctor.config import parse_listen
from torchdoctor.diagnose import MODULES as KINDS
from torchdoctor.diagnose.record import SEVERITIES
from torchdoctor.identity import rank_from_env
from torchdoctor.probe.server import _RequestHandler, _ServerMixin, serve_in_background
from torchdoctor.report.prometheus import CONTENT_TYPE, render
from torchdoctor.store import rundir
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import BY_NAME, STEP_PHASES

if TYPE_CHECKING:
    from torchdoctor.store.tables import Tables

PHASES = STEP_PHASES
# (column of python.steps, metric name, help) for the latest step's gauges
LATEST = (
    ("step", "torchdoctor_step", "index of the latest optimizer step (counted from 0)"),
    ("time", "torchdoctor_last_step_timestamp_seconds", "when the latest step ended (Unix time)"),
    ("duration", "torchdoctor_step_duration_seconds", "duration of the latest step"),
    ("loss", "torchdoctor_loss", "loss of the latest step (mean over its micro-batches)"),
    ("grad_norm", "torchdoctor_grad_norm", "total gradient L2 norm of the latest step"),
    ("lr", "torchdoctor_learning_rate", "learning rate of the first parameter group"),
    ("micro_batches", "torchdoctor_micro_batches", "backward() calls in the latest step"),
    ("allocated", "torchdoctor_memory_allocated_bytes", "CUDA allocated (CPU: resident set)"),
    ("max_allocated", "torchdoctor_memory_max_allocated_bytes", "peak of memory_allocated"),
    ("reserved", "torchdoctor_memory_reserved_bytes", "CUDA reserved (CPU: resident set)"),
    ("rss", "torchdoctor_rss_bytes", "resident set size of the process"),
)


@dataclasses.dataclass
class Family:
    """One metric family: its samples are (labels, value); a counter's name has no _total."""

    name: str
    type: str  # gauge, counter or info-style gauge
    help: str
    samples: list[tuple[dict[str, str], float]] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name + ("_total" if self.type == "counter" else ""),
            "type": self.type,
            "help": self.help,
            "samples": [{"labels": labels, "value": value} for labels, value in self.samples],
        }


class Source(Protocol):
    """Anything that hands out table blocks: a saved run or job (a live process: LiveTables)."""

    def block(self, name: str) -> Block: ...


class LiveTables:
    """The stored tables of this process, read off the training thread, block by block."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables

    def block(self, name: str) -> Block:
        return self.tables[name].snapshot()

    def blocks(self, name: str) -> list[Block]:
        return list(self.tables[name].blocks())


def collect(source: Source, default_rank: int | None = None) -> list[Family]:
    """Every family, per rank. `default_rank` gets zero-valued series before its first step,
    so that alerts on `increase(...)` see the first diagnosis."""
    steps = _blocks(source, "steps")
    diagnoses = Block.concat(BY_NAME["diagnoses"], _blocks(source, "diagnoses"))
    diag_ranks = diagnoses.data["rank"]
    ranks = sorted(set().union(*(_distinct(b.data["rank"]) for b in steps), _distinct(diag_ranks)))
    if not ranks and default_rank is not None:
        ranks = [default_rank]

    info = Family("torchdoctor_info", "gauge", "torchdoctor version (value is always 1)")
    info.samples.append(({"version": __version__}, 1.0))
    steps_total = Family("torchdoctor_steps", "counter", "optimizer steps recorded")
    skipped = Family("torchdoctor_skipped_steps", "counter", "updates skipped (--guard, AMP)")
    phase_total = Family(
        "torchdoctor_phase_seconds",
        "counter",
        "step time by phase, summed over the steps kept (data_wait forward evaluation backward "
        "optimizer other)",
    )
    phase_last = Family("torchdoctor_step_phase_seconds", "gauge", "latest step's time by phase")
    latest = {column: Family(name, "gauge", doc) for column, name, doc in LATEST}
    found = Family(
        "torchdoctor_diagnoses",
        "counter",
        "diagnoses reported, by kind and severity (one whose severity rises is reported again)",
    )
    for rank in ranks:
        label = {"rank": str(rank)}
        count, sums, last = 0, dict.fromkeys(("skipped", *PHASES), 0.0), None
        for block in steps:
            rows, n, final = _rows_of(block.data["rank"], rank)
            if n:
                count += n
                for column in sums:
                    sums[column] += float(block.data[column][rows].sum())
                last = (block, final)
        steps_total.samples.append((label, float(count)))
        skipped.samples.append((label, sums["skipped"]))
        for phase in PHASES:
            phase_total.samples.append(({**label, "phase": phase}, sums[phase]))
        if last is not None:
            block, row = last
            for phase in PHASES:
                phase_last.samples.append(({**label, "phase": phase}, _value(block, phase, row)))
            for column, family in latest.items():
                value = _value(block, column, row)
                if value is not None:
                    family.samples.append((label, value))
        found.samples.extend(_diagnosis_counts(diagnoses, diag_ranks, rank))
    return [info, steps_total, skipped, *latest.values(), phase_last, phase_total, found]


def _blocks(source: Any, name: str) -> list[Block]:
    many = getattr(source, "blocks", None)
    blocks = many(name) if many is not None else [source.block(name)]
    return [b for b in blocks if b.rows]


def _distinct(ranks: np.ndarray) -> set[int]:
    if ranks.size and (ranks == ranks[0]).all():  # one process: no sort, no hash of 1M rows
        return {int(ranks[0])}
    return {int(r) for r in np.unique(ranks)}


def _rows_of(ranks: np.ndarray, rank: int) -> tuple[Any, int, int]:
    """(selector, count, index of the last) of one rank's rows: a slice, with no copy, when
    every row is that rank's (one process); else their indices."""
    if ranks.size and (ranks == rank).all():
        return slice(None), int(ranks.size), int(ranks.size) - 1
    rows = np.flatnonzero(ranks == rank)
    return rows, int(rows.size), int(rows[-1]) if rows.size else -1


def _value(block: Block, column: str, row: int) -> Any:
    mask = block.nulls.get(column)
    if mask is not None and bool(mask[row]):
        return None
    return block.data[column][row].item()


def _diagnosis_counts(
    diagnoses: Block, ranks: np.ndarray, rank: int
) -> list[tuple[dict[str, str], float]]:
    counts: dict[tuple[str, str], int] = {(k, s): 0 for k in KINDS for s in SEVERITIES}
    if diagnoses.rows:
        mine = np.flatnonzero(ranks == rank)
        kinds, severities = diagnoses.data["kind"][mine], diagnoses.data["severity"][mine]
        for kind, severity in zip(kinds.tolist(), severities.tolist(), strict=True):
            counts[(str(kind), str(severity))] = counts.get((str(kind), str(severity)), 0) + 1
    return [
        ({"rank": str(rank), "kind": kind, "severity": severity}, float(n))
        for (kind, severity), n in sorted(counts.items())
    ]


# -- the endpoint ------------------------------------------------------------------------------
class _MetricsHandler(_RequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:
        try:
            if not self._authorized():
                self._text(401, "unauthorized: missing or wrong token\n", bearer=True)
                return
            if urlsplit(self.path).path != "/metrics":
                self._text(404, "not found: torchdoctor serves /metrics\n")
                return
            self._text(200, self.server.render(), CONTENT_TYPE)
        except Exception as exc:  # a bug here must not stop the next scrape
            try:
                self._text(500, f"torchdoctor: internal error: {exc!r}\n")
            except OSError:
                pass

    def do_POST(self) -> None:
        if not self._authorized():
            self._text(401, "unauthorized: missing or wrong token\n", bearer=True)
            return
        self._text(405, "/metrics answers GET only\n")

    def _text(
        self, status: int, body: str, content_type: str = "text/plain; charset=utf-8", **kw: Any
    ) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        if kw.get("bearer"):
            self.send_header("WWW-Authenticate", 'Bearer realm="torchdoctor"')
        self.end_headers()
        self.wfile.write(data)


class MetricsServer(_ServerMixin, HTTPServer):
    allow_reuse_address = True

    def __init__(
        self, host: str, port: int, token: str | None, source: Source, rank: int | None = None
    ) -> None:
        self.token = token
        self.source = source
        self.rank = rank
        if ":" in host:
            self.address_family = socket.AF_INET6
        self._limits()  # the probe's connection cap and per-request deadline apply here too
        super().__init__((host.strip("[]"), port), _MetricsHandler)

    @property
    def address(self) -> str:
        host, port = str(self.server_address[0]), int(self.server_address[1])
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def render(self) -> str:
        return render(collect(self.source, self.rank))


def start_metrics_server(session: Any) -> MetricsServer | None:
    """Serve /metrics for a session on a daemon thread; a warning (not an error) when the
    address cannot be bound: the training goes on without metrics."""
    config = session.config
    host, port = parse_listen(config.metrics, "--metrics")
    port = port + local_rank() if port else port  # one port per process on a node
    token = None
    if not config.metrics_open:
        token = session.token or config.token or secrets.token_urlsafe(24)
        if session.token is None:
            rundir.write_token(session.run_dir, token)
    try:
        server = MetricsServer(host, port, token, LiveTables(session.tables), rank_from_env())
    except OSError as exc:
        warn_once("metrics", f"no /metrics endpoint on {host}:{port}: {exc.strerror or exc}")
        return None
    serve_in_background(server, "torchdoctor-metrics")
    return server


def local_rank() -> int:
    value = os.environ.get("LOCAL_RANK", "")
    return int(value) if value.isdigit() else 0


def global_rank() -> int:
    return rank_from_env()
