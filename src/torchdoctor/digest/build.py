"""A run's digest: everything a report shows, as records (record.py).

It is built from SQL alone (`execute(sql) -> (columns, rows)`), so a live process (through its
query route) and a saved run or job (through the same DuckDB views) give the same digest. Long
series are downsampled here (`downsample.py`); renderers (report/) only draw what they get.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from torchdoctor._json import dumps, float_text
from torchdoctor.digest import time_split
from torchdoctor.digest.downsample import downsample
from torchdoctor.digest.record import (
    Diagnosis,
    Digest,
    GradHeatmap,
    ModuleTime,
    RankStat,
    RankTimes,
    Series,
    SlowModules,
    Summary,
)
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import STEP_PHASES, split_fixes

Execute = Callable[[str], tuple[list[str], list[Any]]]

VERSION = 1
PAGE = 100_000  # the live query route returns at most this many rows at a time
MAX_POINTS = 3000  # per chart: about two per pixel of a wide screen
MAX_DIAGNOSES = 100
MAX_HEAT_MODULES = 64
MAX_HEAT_COLUMNS = 200
MAX_MODULES = 20
MAX_EVIDENCE_CHARS = 1000  # per value: a long history is cut
DECADES_FOR_LOG = 2  # a series spanning 100x or more is drawn on a log scale
PHASES = STEP_PHASES
STEP_COLUMNS = (
    "rank",
    "step",
    "duration",
    *PHASES,
    "loss",
    "grad_norm",
    "lr",
    "allocated",
    "max_allocated",
    "reserved",
    "skipped",
)
# Series whose extremes the downsampling keeps (the others ride along on the same rows).
EXTREME_COLUMNS = (
    "loss",
    "grad_norm",
    "duration",
    "data_wait",
    "allocated",
    "reserved",
    "max_allocated",
)
FINE_BUCKETS = 5000  # per rank, for the first pass a long live run gets in DuckDB
_SEVERITY = {"error": 0, "warning": 1, "info": 2}


class DigestError(Exception):
    """The source could not answer a query the digest needs."""


def build(
    execute: Execute,
    meta: dict[str, Any],
    source: str,
    warnings: Sequence[str] = (),
    steps: dict[str, np.ndarray] | None = None,
) -> Digest:
    """The digest of one run or job: meta, summary, chart series, modules, diagnoses.

    `steps` (from `step_columns`) spares a saved run the trip of a million rows through SQL;
    without it they are fetched with `execute`, page by page."""
    diagnoses, omitted = fetch_diagnoses(execute)
    marked = [d.step for d in diagnoses if d.step is not None]
    if steps is None:
        steps = fetch_steps(execute, marked)
    stats = rank_stats(execute)
    ranks = sorted(set(stats) | set(_ranks_of(execute, "diagnoses")))
    # The charts follow the lowest rank that recorded steps (usually rank 0).
    primary = min(stats) if stats else (ranks[0] if ranks else 0)
    mine = steps_of_rank(steps, primary)
    total = _int(stats[primary]["steps"]) if primary in stats else 0
    compiling = compile_seconds(execute, primary)
    bands, mine["duration"] = time_split.split(mine, mine["duration"], compiling(mine["step"]))
    mine.update(bands)
    return Digest(
        version=VERSION,
        source=source,
        generated=_dt.datetime.now().isoformat(timespec="seconds"),
        meta=_meta(meta),
        ranks=ranks,
        primary_rank=primary,
        summary=summary(stats.get(primary), mine, total or 0),
        training=training_series(mine, marked, total),
        phases=phase_series(mine, marked, total),
        memory=memory_series(mine, marked, total),
        rank_times=rank_times(steps, stats, marked),
        modules=slowest_modules(execute),
        grad_heatmap=grad_heatmap(execute, primary),
        untraced=untraced(execute, total or 0),
        diagnoses=diagnoses,
        diagnoses_omitted=omitted,
        warnings=list(warnings),
    )


# -- queries ---------------------------------------------------------------------------------


def fetch_steps(
    execute: Execute, keep: Sequence[int] = (), page: int = PAGE
) -> dict[str, np.ndarray]:
    """The step rows of every rank, as columns, in pages the live route can answer.

    Up to PAGE rows per rank come whole. Past that (a long live run) DuckDB does a first,
    finer pass of the same selection: in each of FINE_BUCKETS stretches of a rank's steps, the
    rows holding the smallest and largest value of each charted series, plus the `keep` steps.
    That bounds what crosses the socket and what the training process spends encoding it;
    `downsample` then picks from those rows as it would from all of them."""
    names, rows = _run(
        execute, "SELECT max(n) AS n FROM (SELECT count(*) AS n FROM python.steps GROUP BY rank)"
    )
    most = _int(rows[0][0]) if rows else None
    cols = ", ".join(STEP_COLUMNS)
    if not most or most <= page:
        query = f"SELECT {cols} FROM python.steps ORDER BY rank, step, time"
    else:
        width = -(-most // min(FINE_BUCKETS, page // 2))
        picks = ", ".join(f"arg_min(i, {c}), arg_max(i, {c})" for c in EXTREME_COLUMNS)
        kept = ", ".join(str(int(k)) for k in keep) or "NULL"
        query = f"""
            WITH s AS (
                SELECT {cols}, row_number() OVER (PARTITION BY rank ORDER BY step, time) - 1 AS i
                FROM python.steps
            ),
            p AS (
                SELECT DISTINCT rank, unnest([{picks}]) AS i
                FROM s GROUP BY rank, i // {width}
            )
            SELECT {cols} FROM s
            WHERE EXISTS (SELECT 1 FROM p WHERE p.rank = s.rank AND p.i = s.i)
               OR s.step IN ({kept})
            ORDER BY rank, i
        """
    pages: list[dict[str, np.ndarray]] = []
    offset = 0
    while True:
        sql = f"{query} LIMIT {page} OFFSET {offset}"
        names, rows = _run(execute, sql)
        pages.append(_columns(names, rows))
        if len(rows) < page:
            break
        offset += page
    return {c: np.concatenate([p[c] for p in pages]) for c in pages[0]}


def step_columns(block: Block) -> dict[str, np.ndarray]:
    """The steps table's columns as fetch_steps gives them, straight from a saved block."""
    order = np.lexsort((block.data["time"], block.data["step"], block.data["rank"]))
    out: dict[str, np.ndarray] = {}
    for name in STEP_COLUMNS:
        values = block.data[name][order]
        null = block.null_mask(name)[order]
        if name in ("rank", "step"):
            out[name] = values.astype(np.int64)
        else:
            out[name] = np.where(null, np.nan, values.astype(np.float64))
        out[f"__null_{name}"] = null
    return out


def fetch_diagnoses(execute: Execute) -> tuple[list[Diagnosis], int]:
    """The diagnoses worth showing: the latest report of each (rank, kind, location) (its
    state: resolved, the finding it follows), the most severe first when there are too many;
    and how many were left out."""
    names, rows = _run(
        execute,
        "SELECT time, step, rank, kind, severity, location, summary, evidence, fix, "
        "resolved, follows FROM python.diagnoses ORDER BY time",
    )
    latest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        r = dict(zip(names, row, strict=True))
        latest[(r["rank"], r["kind"], r["location"])] = r
    found = sorted(latest.values(), key=lambda r: (_SEVERITY.get(r["severity"], 3), r["time"]))
    shown = sorted(found[:MAX_DIAGNOSES], key=lambda r: _num(r["time"]) or 0.0)
    out = []
    for i, r in enumerate(shown):
        out.append(
            Diagnosis(
                id=i,
                kind=r["kind"],
                severity=r["severity"],
                step=_int(r["step"]),
                rank=_int(r["rank"]),
                location=r["location"],
                summary=r["summary"],
                time=_num(r["time"]),
                evidence=_evidence(r["evidence"]),
                fixes=split_fixes(r["fix"]),
                resolved=_int(r["resolved"]),
                follows=r["follows"],
            )
        )
    return out, len(found) - len(shown)


def slowest_modules(execute: Execute) -> SlowModules:
    """Forward and backward time per traced step of the modules that take most (inclusive of
    their children), pooled over ranks."""
    names, rows = _run(
        execute,
        """
        WITH t AS (SELECT * FROM python.torch_trace),
        n AS (SELECT count(*) AS steps FROM (SELECT DISTINCT rank, step FROM t))
        SELECT module, any_value(type) AS type, min(depth) AS depth,
               sum(CASE WHEN stage = 'forward' THEN duration ELSE 0 END) AS forward,
               sum(CASE WHEN stage = 'backward' THEN duration ELSE 0 END) AS backward,
               count(*) AS calls, any_value(n.steps) AS steps
        FROM t, n GROUP BY module
        """,
    )
    recs = [dict(zip(names, r, strict=True)) for r in rows]
    inner = [r for r in recs if (_int(r["depth"]) or 0) > 0]
    chosen = inner or recs  # a model with no submodules: show the model itself
    traced = max((_int(r["steps"]) or 0 for r in recs), default=0)
    per = max(traced, 1)
    items = [
        ModuleTime(
            module=r["module"],
            type=r["type"],
            forward=(_num(r["forward"]) or 0.0) / per,
            backward=(_num(r["backward"]) or 0.0) / per,
            calls=(_int(r["calls"]) or 0) / per,
        )
        for r in chosen
    ]
    items.sort(key=lambda m: -(m.forward + m.backward))
    return SlowModules(traced, items[:MAX_MODULES], max(0, len(items) - MAX_MODULES))


def untraced(execute: Execute, steps: int) -> str | None:
    """Why no module call was traced, for the charts that need them: `compile` (module tracing
    is off under torch.compile), `short` (the run ended before its first traced step), `off`
    (--trace-every 0); None when some were."""
    _names, rows = _run(execute, "SELECT count(*) FROM python.torch_trace")
    if rows and _int(rows[0][0]):
        return None
    try:
        _names, rows = execute(
            "SELECT (SELECT count(*) FROM python.events WHERE kind = 'compile_seen') + "
            "(SELECT count(*) FROM python.compile)"
        )
    except Exception:  # a source without those tables (a live process of an old version)
        rows = []
    if rows and _int(rows[0][0]):
        return "compile"
    return "short" if steps <= 1 else "off"


def grad_heatmap(execute: Execute, rank: int) -> GradHeatmap:
    """Per-module gradient norms over the traced steps of one rank: log10 of the largest norm
    in each (module, column of steps) cell."""
    names, rows = _run(
        execute,
        "SELECT count(DISTINCT step) AS n, min(step) AS lo, max(step) AS hi "
        f"FROM python.module_grads WHERE rank = {int(rank)}",
    )
    head = dict(zip(names, rows[0], strict=True)) if rows else {}
    count, lo, hi = _int(head.get("n")) or 0, _int(head.get("lo")), _int(head.get("hi"))
    if not count or lo is None or hi is None:
        return GradHeatmap(rank, [], 1, [], [], 0)
    width = 1 if count <= MAX_HEAT_COLUMNS else -(-(hi - lo + 1) // MAX_HEAT_COLUMNS)
    names, rows = _run(
        execute,
        f"""
        SELECT module, {lo} + ((step - {lo}) // {width}) * {width} AS col,
               max(grad_norm) AS g, bool_or(isnan(grad_norm) OR isinf(grad_norm)) AS bad
        FROM python.module_grads WHERE rank = {int(rank)} GROUP BY ALL
        """,
    )
    recs = [dict(zip(names, r, strict=True)) for r in rows]
    modules = sorted({str(r["module"]) for r in recs}, key=_natural)
    more = max(0, len(modules) - MAX_HEAT_MODULES)
    modules = modules[:MAX_HEAT_MODULES]
    columns = sorted({int(r["col"]) for r in recs})
    ypos = {m: i for i, m in enumerate(modules)}
    xpos = {c: i for i, c in enumerate(columns)}
    cells: list[list[Any]] = []
    for r in recs:
        y = ypos.get(str(r["module"]))
        if y is None:
            continue
        g = _num(r["g"])
        if r["bad"] or (g is not None and not math.isfinite(g)):
            cells.append([xpos[int(r["col"])], y, None, "non-finite"])
        elif g is None:
            cells.append([xpos[int(r["col"])], y, None, "no gradient"])
        elif g <= 0:
            cells.append([xpos[int(r["col"])], y, None, "0"])
        else:
            cells.append([xpos[int(r["col"])], y, _round(math.log10(g)), _round(g)])
    cells.sort()
    return GradHeatmap(rank, columns, width, modules, cells, more)


# -- series ----------------------------------------------------------------------------------


def steps_of_rank(steps: dict[str, np.ndarray], rank: int) -> dict[str, np.ndarray]:
    mask = steps["rank"] == rank
    return {k: v[mask] for k, v in steps.items()}


def rank_stats(execute: Execute) -> dict[int, dict[str, Any]]:
    """Totals per rank over all of its steps (SQL sees every row, whatever was fetched)."""
    sums = ", ".join(f"sum({p}) AS {p}" for p in PHASES)
    names, rows = _run(
        execute,
        f"""
        SELECT rank, count(*) AS steps, min(step) AS first_step, max(step) AS last_step,
               sum(duration) AS duration, avg(duration) AS mean, median(duration) AS median,
               max(duration) AS max, avg(data_wait) AS data_wait_mean, {sums},
               count(*) FILTER (WHERE skipped) AS skipped, max(max_allocated) AS peak_memory,
               arg_min(loss, step) FILTER (WHERE isfinite(loss)) AS first_loss,
               arg_max(loss, step) AS last_loss
        FROM python.steps GROUP BY rank ORDER BY rank
        """,
    )
    out = {}
    for row in rows:
        r = dict(zip(names, row, strict=True))
        out[int(r["rank"])] = r
    return out


def compile_seconds(execute: Execute, rank: int) -> Callable[[np.ndarray], np.ndarray]:
    """Seconds torch.compile spent compiling, summed along the given steps of one rank
    (compiling before the first of them counts in it)."""
    try:
        _names, rows = execute(
            "SELECT coalesce(step, -1) AS step, sum(duration) AS seconds FROM python.compile "
            f"WHERE duration IS NOT NULL AND rank = {int(rank)} GROUP BY 1"
        )
    except Exception:  # a source that has no compile table (a live process of an old version)
        rows = []
    at = np.array([int(r[0]) for r in rows], dtype=np.int64)
    seconds = np.array([_float(r[1]) for r in rows], dtype=float)
    return lambda steps: time_split.by_step(steps, at, seconds)


def summary(
    stats: dict[str, Any] | None, steps: dict[str, np.ndarray] | None = None, total: int = 0
) -> Summary:
    """The rank's totals. Its time split comes from `steps` (the rank's step rows, compile
    bands in) when they are all of them, else from the totals of SQL (a very long live run,
    its compile time left in the phases)."""
    if not stats or not _int(stats["steps"]):
        return Summary(0)
    duration = _num(stats["duration"])
    if steps is not None and len(steps["step"]) == total:
        phases = time_split.totals({p: steps[p] for p in time_split.SHOWN})
        duration = float(np.nansum(steps["duration"]))
    else:
        phases = {p: _num(stats.get(p)) or 0.0 for p in time_split.SHOWN}
    first = _num(stats["first_loss"])
    last = _num(stats["last_loss"])
    return Summary(
        steps=_int(stats["steps"]) or 0,
        first_step=_int(stats["first_step"]),
        last_step=_int(stats["last_step"]),
        duration=duration,
        step_time_median=_num(stats["median"]),
        phases=phases,
        skipped=_int(stats["skipped"]) or 0,
        first_loss=None if first is None else _finite_or_text(first),
        last_loss=None if last is None else _finite_or_text(last),
        peak_memory=_int(stats["peak_memory"]),
    )


def training_series(
    steps: dict[str, np.ndarray], marked: Sequence[int], total: int | None = None
) -> Series:
    cols = ("loss", "grad_norm", "lr")
    return _series(steps, cols, ("loss", "grad_norm"), marked, log=True, total=total)


def phase_series(
    steps: dict[str, np.ndarray], marked: Sequence[int], total: int | None = None
) -> Series:
    shown = ("duration", *time_split.SHOWN)
    return _series(steps, shown, ("duration", "data_wait"), marked, total=total)


def memory_series(
    steps: dict[str, np.ndarray], marked: Sequence[int], total: int | None = None
) -> Series:
    cols = ("allocated", "reserved", "max_allocated")
    return _series(steps, cols, cols, marked, total=total)


def rank_times(
    steps: dict[str, np.ndarray], stats: dict[int, dict[str, Any]], marked: Sequence[int]
) -> RankTimes:
    """Step time of every rank, for a job; each rank downsampled on its own."""
    if len(stats) < 2:
        return RankTimes([], [], [])
    ranks: list[int] = []
    series: list[Series] = []
    rows: list[RankStat] = []
    budget = max(200, MAX_POINTS // len(stats))
    for rank, st in sorted(stats.items()):
        mine = steps_of_rank(steps, rank)
        if not len(mine["step"]):
            continue
        total = _int(st["steps"])
        s = _series(
            mine, ("duration", "data_wait"), ("duration",), marked, budget=budget, total=total
        )
        ranks.append(rank)
        series.append(s)
        rows.append(
            RankStat(
                rank=rank,
                steps=total,
                mean=_num(st["mean"]),
                median=_num(st["median"]),
                max=_num(st["max"]),
                data_wait=_num(st["data_wait_mean"]),
            )
        )
    return RankTimes(ranks, series, rows)


def _series(
    steps: dict[str, np.ndarray],
    columns: Iterable[str],
    extremes: Iterable[str],
    marked: Sequence[int],
    log: bool = False,
    budget: int = MAX_POINTS,
    total: int | None = None,
) -> Series:
    """`total`: the rank's steps in all, when `steps` holds a first selection of them."""
    x = steps["step"]
    idx = downsample(x, [steps[c] for c in extremes], budget, keep=marked)
    values: dict[str, list[float | int | None]] = {}
    scales: dict[str, str] = {}
    nonfinite: dict[str, list[int]] = {}
    for c in columns:
        v = steps[c][idx]
        values[c] = [_round(float(f)) if math.isfinite(f) else None for f in v.tolist()]
        bad = ~np.isfinite(steps[c]) & ~_null(steps, c)
        if bad.any():
            nonfinite[c] = x[bad][:MAX_POINTS].tolist()
        if log:
            scales[c] = "log" if spans_decades(steps[c]) else "linear"
    return Series(
        total=len(x) if total is None else total,
        kept=len(idx),
        step=x[idx].tolist(),
        values=values,
        scale=scales if log else None,
        nonfinite=nonfinite,
    )


def spans_decades(values: np.ndarray, decades: float = DECADES_FOR_LOG) -> bool:
    """Whether a positive series covers `decades` powers of ten (then a log axis reads better);
    never for a series with zeros or negative values."""
    v = values[np.isfinite(values)]
    if not v.size or (v <= 0).any():
        return False
    return bool(math.log10(float(v.max()) / float(v.min())) >= decades)


# -- helpers ---------------------------------------------------------------------------------


def _run(execute: Execute, sql: str) -> tuple[list[str], list[Any]]:
    names, rows = execute(sql)
    return list(names), list(rows)


def _columns(names: list[str], rows: list[Any]) -> dict[str, np.ndarray]:
    """Rows to numpy columns. Numbers arrive as floats, ints, None (NULL) or, from a live
    process's JSON, the strings nan/inf/-inf; NULL becomes NaN with a `__null_<name>` mask."""
    out: dict[str, np.ndarray] = {}
    cols = list(zip(*rows, strict=True)) if rows else [()] * len(names)
    for name, values in zip(names, cols, strict=True):
        # numpy reads None as NaN and parses the strings nan/inf/-inf.
        arr = np.array(values, dtype=np.float64)
        out[f"__null_{name}"] = np.array([v is None for v in values], dtype=bool)
        out[name] = np.nan_to_num(arr).astype(np.int64) if name in ("rank", "step") else arr
    return out


def _null(steps: dict[str, np.ndarray], name: str) -> np.ndarray:
    mask = steps.get(f"__null_{name}")
    return np.zeros(len(steps[name]), dtype=bool) if mask is None else mask


def _float(value: Any) -> float:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _num(value: Any) -> float | None:
    return None if value is None else _float(value)


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def _round(value: float) -> float | int:
    """Six significant digits: more than a chart can show, and a third of the bytes."""
    short = float(f"{value:.6g}")
    return int(short) if short.is_integer() and abs(short) < 2**53 else short


def _finite_or_text(value: float) -> float | str:
    return _round(value) if math.isfinite(value) else float_text(value)


def _evidence(text: Any) -> dict[str, Any]:
    """A finding's evidence for the page, long values cut. (The digest sits below diagnose/,
    so it reads the stored JSON itself, not through diagnose.evidence.decode.)"""
    try:
        obj = json.loads(text or "{}") if isinstance(text, str) else (text or {})
    except ValueError:
        return {"text": str(text)[:MAX_EVIDENCE_CHARS]}
    if not isinstance(obj, dict):
        return {"value": obj}
    out: dict[str, Any] = {}
    for key, value in obj.items():
        raw = dumps(value)
        out[str(key)] = (
            value if len(raw) <= MAX_EVIDENCE_CHARS else raw[:MAX_EVIDENCE_CHARS] + "..."
        )
    return out


def _ranks_of(execute: Execute, table: str) -> list[int]:
    _names, rows = _run(execute, f"SELECT DISTINCT rank FROM python.{table} WHERE rank IS NOT NULL")
    return [int(r[0]) for r in rows]


def _natural(name: str) -> list[Any]:
    """encoder.layers.2 before encoder.layers.10."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.]", name)]


def _meta(meta: dict[str, Any]) -> dict[str, Any]:
    keep = (
        *("command", "host", "pid", "started", "ended", "attached", "status", "exit_code"),
        "steps",
    )
    out = {k: meta[k] for k in keep if meta.get(k) is not None}
    for k in ("job", "world_size"):
        if meta.get(k) is not None:
            out[k] = meta[k]
    if meta.get("failures"):  # parts of torchdoctor failed: the record is not whole
        out["failures"] = meta["failures"]
    if isinstance(out.get("command"), list):
        out["command"] = " ".join(str(a) for a in out["command"])
    return out
