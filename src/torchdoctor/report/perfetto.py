"""A saved run or job as Chrome trace-event JSON, which Perfetto (ui.perfetto.dev) and
chrome://tracing open.

One process per rank ("rank N"). Its "steps" thread holds a slice per step with the phases
inside it; the phases' lengths are measured, their order inside the step is the usual one
(evaluation, data, forward, backward, other, optimizer: a step ends when the optimizer's step
returns, and an evaluation pass runs between two steps),
their exact start times are not recorded. Module calls of traced steps sit on "forward" and
"backward" threads at their recorded times, spread over as many lanes as it takes for slices on
one thread to nest properly. Collectives, when the run recorded any, get their own thread;
diagnoses are instant events on a "diagnoses" thread, drawn across the rank. Times are
microseconds of wall-clock time from one origin for all ranks (so ranks line up), the whole
second before the first event; otherData.origin_unix_s says which. Absolute Unix
microseconds would not keep sub-microsecond precision in a double.

Events are written as they are made: a million-step run is never held as a list of dicts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, TextIO

import numpy as np

from torchdoctor._json import float_text
from torchdoctor.store.columns import Block

STEPS_TID = 1
COLLECTIVES_TID = 2
DIAGNOSES_TID = 3
FORWARD_TID = 10  # lanes 10, 11, ...
BACKWARD_TID = 100
COLLECTIVE_LANES = 1000  # more lanes of collectives: 1001, 1002, ...
LANE_LIMIT = 80  # lanes per stage; deeper nestings share the last one
# A child that overruns its parent by less than this (clock rounding) is trimmed to fit.
SLACK_US = 1.0
# The order of phases inside a step (see the module docstring).
PHASE_ORDER = ("evaluation", "data_wait", "forward", "backward", "other", "optimizer")
_CHUNK = 20_000  # steps formatted per joined chunk
PHASE_NAMES = {
    "evaluation": "evaluation",
    "data_wait": "data",
    "forward": "forward",
    "backward": "backward",
    "other": "other",
    "optimizer": "optimizer",
}


class Tables(Protocol):
    def table_names(self) -> list[str]: ...

    def block(self, name: str) -> Block: ...


def write(tables: Tables, out: TextIO, steps: tuple[int, int] | None = None) -> dict[str, int]:
    """Writes the trace; returns how many events of each kind went in. `steps` keeps only the
    steps (and traced module calls) from..to, inclusive."""
    counts = {"steps": 0, "phases": 0, "modules": 0, "collectives": 0, "diagnoses": 0}
    step_block = tables.block("steps")
    ranks = sorted({int(r) for r in np.unique(step_block.data["rank"])}) if step_block.rows else []
    trace = tables.block("torch_trace")
    diagnoses = tables.block("diagnoses")
    collectives = tables.block("collectives") if "collectives" in tables.table_names() else None
    for block in (trace, diagnoses, collectives):
        if block is not None and block.rows and "rank" in block.data:
            ranks = sorted(set(ranks) | {int(r) for r in np.unique(block.data["rank"])})
    origin = _origin([step_block, trace, diagnoses, collectives])
    other = {"producer": "torchdoctor", "origin_unix_s": origin}
    out.write(f'{{"displayTimeUnit":"ms","otherData":{json.dumps(other)},"traceEvents":[\n')
    first = True

    def emit(lines: Iterable[str]) -> None:
        nonlocal first
        for line in lines:
            if not line:
                continue
            if not first:
                out.write(",\n")
            out.write(line)
            first = False

    for rank in ranks:
        emit(_metadata(rank, collectives is not None and collectives.rows > 0))
        emit(_step_events(step_block, rank, steps, origin, counts))
        emit(_module_events(trace, rank, steps, origin, counts))
        if collectives is not None:
            emit(_collective_events(collectives, rank, steps, origin, counts))
        emit(_diagnosis_events(diagnoses, rank, origin, counts))
    out.write("\n]}\n")
    return counts


# -- tracks ----------------------------------------------------------------------------------


def _metadata(rank: int, collectives: bool) -> Iterator[str]:
    pid = pid_of(rank)
    yield _meta("process_name", pid, 0, {"name": f"rank {rank}"})
    yield _meta("process_sort_index", pid, 0, {"sort_index": rank})
    yield _meta("thread_name", pid, STEPS_TID, {"name": "steps"})
    yield _meta("thread_name", pid, DIAGNOSES_TID, {"name": "diagnoses"})
    if collectives:
        yield _meta("thread_name", pid, COLLECTIVES_TID, {"name": "collectives"})


def _step_events(
    block: Block, rank: int, window: tuple[int, int] | None, origin: float, counts: dict[str, int]
) -> Iterator[str]:
    if not block.rows:
        return
    mask = block.data["rank"] == rank
    if window is not None:
        mask &= (block.data["step"] >= window[0]) & (block.data["step"] <= window[1])
    idx = np.flatnonzero(mask)
    if not idx.size:
        return
    end = (block.data["time"][idx] - origin) * 1e6
    dur = np.maximum(np.nan_to_num(block.data["duration"][idx]) * 1e6, 0.0)
    order = np.argsort(end - dur, kind="stable")
    idx, end, dur = idx[order], end[order], dur[order]
    # Clocks are not perfect: a step starts no earlier than the steps before it ended, so
    # that steps never overlap on their track.
    before = np.concatenate(([-np.inf], np.maximum.accumulate(end)[:-1]))
    start = np.maximum(end - dur, before)
    dur = np.maximum(end - start, 0.0)
    # Phases laid end to end inside their step, the last ones cut where the step ends.
    lengths = np.stack(
        [np.maximum(np.nan_to_num(block.data[p][idx]) * 1e6, 0.0) for p in PHASE_ORDER], axis=1
    )
    ends = np.minimum(np.cumsum(lengths, axis=1), dur[:, None])
    begins = np.concatenate((np.zeros((len(idx), 1)), ends[:, :-1]), axis=1)
    phase_ts = start[:, None] + begins
    phase_dur = ends - begins
    loss = [_jtext(v) for v in block.data["loss"][idx].tolist()]
    grad = [_jtext(v) for v in block.data["grad_norm"][idx].tolist()]
    steps = block.data["step"][idx].tolist()
    pid = pid_of(rank)
    step_fmt = (
        f'{{"ph":"X","name":"step %d","cat":"step","pid":{pid},"tid":{STEPS_TID},'
        '"ts":%.3f,"dur":%.3f,"args":{"step":%d,"loss":%s,"grad_norm":%s}}'
    )
    starts, durs = start.tolist(), dur.tolist()
    for lo in range(0, len(steps), _CHUNK):  # formatted in chunks: millions of events stay fast
        hi = min(lo + _CHUNK, len(steps))
        columns = [
            [
                step_fmt % (n, t, d, n, lv, gv)
                for n, t, d, lv, gv in zip(
                    steps[lo:hi], starts[lo:hi], durs[lo:hi], loss[lo:hi], grad[lo:hi], strict=True
                )
            ]
        ]
        for k, p in enumerate(PHASE_ORDER):
            fmt = (
                f'{{"ph":"X","name":"{PHASE_NAMES[p]}","cat":"phase","pid":{pid},'
                f'"tid":{STEPS_TID},"ts":%.3f,"dur":%.3f}}'
            )
            columns.append(
                [
                    fmt % (t, d) if d > 0 else ""
                    for t, d in zip(
                        phase_ts[lo:hi, k].tolist(), phase_dur[lo:hi, k].tolist(), strict=True
                    )
                ]
            )
        # Each step, then its phases in order: start times never go back on the track.
        lines = [line for row in zip(*columns, strict=True) for line in row if line]
        counts["steps"] += hi - lo
        counts["phases"] += len(lines) - (hi - lo)
        yield ",\n".join(lines)


def _module_events(
    block: Block, rank: int, window: tuple[int, int] | None, origin: float, counts: dict[str, int]
) -> Iterator[str]:
    if not block.rows:
        return
    pid = pid_of(rank)
    for stage, base in (("forward", FORWARD_TID), ("backward", BACKWARD_TID)):
        mask = (block.data["rank"] == rank) & (block.data["stage"] == stage)
        if window is not None:
            mask &= (block.data["step"] >= window[0]) & (block.data["step"] <= window[1])
        idx = np.flatnonzero(mask)
        if not idx.size:
            continue
        start = (block.data["time"][idx] - origin) * 1e6
        dur = np.maximum(np.nan_to_num(block.data["duration"][idx]) * 1e6, 0.0)
        lanes, durations = assign_lanes(start, dur)
        # Few distinct names over many calls: each encoded once.
        encoded: dict[Any, str] = {}
        modules = [
            encoded.get(m) or encoded.setdefault(m, json.dumps(str(m)))
            for m in block.data["module"][idx].tolist()
        ]
        types = [
            encoded.get(t) or encoded.setdefault(t, json.dumps(str(t)))
            for t in block.data["type"][idx].tolist()
        ]
        steps = block.data["step"][idx].tolist()
        starts = start.tolist()
        for lane, members in _by_lane(lanes, start, durations):
            tid = base + lane
            name = stage if lane == 0 else f"{stage} ({lane + 1})"
            yield _meta("thread_name", pid, tid, {"name": name})
            yield _meta("thread_sort_index", pid, tid, {"sort_index": tid})
            fmt = (
                f'{{"ph":"X","name":%s,"cat":"{stage}","pid":{pid},"tid":{tid},"ts":%.3f,'
                '"dur":%.3f,"args":{"type":%s,"step":%d}}'
            )
            counts["modules"] += len(members)
            yield ",\n".join(
                fmt % (modules[i], starts[i], durations[i], types[i], steps[i]) for i in members
            )


def _collective_events(
    block: Block, rank: int, window: tuple[int, int] | None, origin: float, counts: dict[str, int]
) -> Iterator[str]:
    """Collectives, written against the columns the table has (rank, op, a start time, duration,
    and whatever else it records goes into args)."""
    if not block.rows:
        return
    cols = block.spec.column_names
    start_col = next((c for c in ("start", "start_time", "time") if c in cols), None)
    if start_col is None or "rank" not in cols:
        return
    mask = block.data["rank"] == rank
    if window is not None and "step" in cols:
        mask &= (block.data["step"] >= window[0]) & (block.data["step"] <= window[1])
    idx = np.flatnonzero(mask)
    if not idx.size:
        return
    start = (block.data[start_col][idx].astype(np.float64) - origin) * 1e6
    has_dur = "duration" in cols
    raw_dur = block.data["duration"][idx].astype(np.float64) if has_dur else np.zeros(idx.size)
    unfinished = ~np.isfinite(raw_dur) | block.null_mask("duration")[idx] if has_dur else None
    dur = np.maximum(np.nan_to_num(raw_dur) * 1e6, 0.0)
    lanes, durations = assign_lanes(start, dur)
    pid = pid_of(rank)
    extra = [c for c in cols if c not in (start_col, "duration", "rank")]
    records = {c: block.column(c) for c in extra}
    for lane, members in _by_lane(lanes, start, durations):
        tid = COLLECTIVES_TID if lane == 0 else COLLECTIVE_LANES + lane
        if lane:
            yield _meta("thread_name", pid, tid, {"name": f"collectives ({lane + 1})"})
        for i in members:
            j = int(idx[i])
            args = {c: _jval(records[c][j]) for c in extra}
            name = str(args.get("op") or "collective")
            counts["collectives"] += 1
            if unfinished is not None and unfinished[i]:
                # no duration: still pending, or ended at a moment not seen (a polled work)
                ended = args.get("state") in ("completed", "failed")
                label = name if ended else f"{name} (not finished)"
                yield _instant(label, "collective", pid, tid, start[i], args)
            else:
                yield _slice(name, "collective", pid, tid, start[i], durations[i], args)


def _diagnosis_events(
    block: Block, rank: int, origin: float, counts: dict[str, int]
) -> Iterator[str]:
    if not block.rows:
        return
    pid = pid_of(rank)
    idx = np.flatnonzero(block.data["rank"] == rank)
    records = block.to_records()
    for i in sorted(idx.tolist(), key=lambda i: float(block.data["time"][i])):
        r = records[i]
        args = {
            "severity": r["severity"],
            "step": r["step"],
            "location": r["location"],
            "summary": r["summary"],
            "fix": r["fix"],
        }
        counts["diagnoses"] += 1
        yield _instant(
            str(r["kind"]), "diagnosis", pid, STEPS_TID, float(r["time"]) * 1e6, args, "p"
        )


# -- layout ----------------------------------------------------------------------------------


def assign_lanes(
    start: Sequence[float] | np.ndarray, dur: Sequence[float] | np.ndarray
) -> tuple[list[int], list[float]]:
    """Puts slices on lanes so that on each lane any two slices are either disjoint or one
    holds the other: what a trace viewer needs to draw one thread. Slices are taken in start
    order (the longer first on a tie); each goes on the first lane where it fits, else on a
    new one. Returns each slice's lane and its duration, trimmed where it overran its parent by
    less than SLACK_US (clock rounding)."""
    n = len(start)
    order = sorted(range(n), key=lambda i: (float(start[i]), -float(dur[i])))
    lanes = [0] * n
    durations = [float(d) for d in dur]
    stacks: list[list[float]] = []  # per lane, the ends of the slices still open
    for i in order:
        s = float(start[i])
        e = s + durations[i]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if stack and e > stack[-1]:
                if e - stack[-1] >= SLACK_US and lane < LANE_LIMIT - 1:
                    continue
                e = stack[-1]  # rounding, or the last lane: trimmed to nest
                durations[i] = max(0.0, e - s)
            stack.append(e)
            lanes[i] = lane
            break
        else:
            stacks.append([e])
            lanes[i] = len(stacks) - 1
    return lanes, durations


def _by_lane(
    lanes: list[int], start: np.ndarray, durations: list[float]
) -> Iterator[tuple[int, list[int]]]:
    """Each lane used, with its slices in the order a viewer reads them: by start, the
    enclosing one first."""
    members: dict[int, list[int]] = {}
    for i, lane in enumerate(lanes):
        members.setdefault(lane, []).append(i)
    for lane in sorted(members):
        yield lane, sorted(members[lane], key=lambda i: (float(start[i]), -durations[i]))


# -- events ----------------------------------------------------------------------------------


def _origin(blocks: Sequence[Block | None]) -> float:
    """The whole Unix second before the earliest time of any event."""
    earliest = []
    for block in blocks:
        if block is None or not block.rows:
            continue
        for col in ("time", "start", "start_time"):
            if col in block.data:
                values = block.data[col].astype(np.float64)
                if col == "time" and "duration" in block.data and block.spec.name == "steps":
                    values = values - np.nan_to_num(block.data["duration"].astype(np.float64))
                finite = values[np.isfinite(values)]
                if finite.size:
                    earliest.append(float(finite.min()))
                break
    return float(np.floor(min(earliest))) if earliest else 0.0


def pid_of(rank: int) -> int:
    return rank + 1  # pid 0 means "no process" to some viewers


def _slice(
    name: str, cat: str, pid: int, tid: int, ts: float, dur: float, args: dict[str, Any] | None
) -> str:
    head = (
        f'{{"ph":"X","name":{json.dumps(name)},"cat":"{cat}","pid":{pid},"tid":{tid},'
        f'"ts":{ts:.3f},"dur":{dur:.3f}'
    )
    if args:
        return head + f',"args":{json.dumps(args, allow_nan=False, default=str)}}}'
    return head + "}"


def _instant(
    name: str,
    cat: str,
    pid: int,
    tid: int,
    ts: float,
    args: dict[str, Any],
    scope: str = "t",
) -> str:
    return (
        f'{{"ph":"i","s":"{scope}","name":{json.dumps(name)},"cat":"{cat}","pid":{pid},'
        f'"tid":{tid},"ts":{ts:.3f},"args":{json.dumps(args, allow_nan=False, default=str)}}}'
    )


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> str:
    return json.dumps({"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args})


def _jtext(value: float) -> str:
    """A float as JSON text; JSON has no NaN or infinity, so those are strings."""
    if math.isfinite(value):
        return repr(value)
    return f'"{float_text(value)}"'


def _jnum(value: Any) -> float | str | None:
    v = float(value)
    if np.isfinite(v):
        return v
    return float_text(v)


def _jval(value: Any) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return _jnum(value)
    return value
