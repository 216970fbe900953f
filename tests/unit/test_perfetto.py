"""The Perfetto trace of a saved run: well-formed, every step and phase, module calls that
nest, collectives when the table exists, diagnoses as instants."""

from __future__ import annotations

import io
import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from synthetic import write_run
from trace_check import check_trace

from torchdoctor.report.perfetto import SLACK_US, assign_lanes, write
from torchdoctor.store.columns import Block
from torchdoctor.store.saved import open_run
from torchdoctor.store.schema import Column, TableSpec


def _trace(tables: object, steps: tuple[int, int] | None = None) -> tuple[dict, dict]:
    buf = io.StringIO()
    counts = write(tables, buf, steps)  # type: ignore[arg-type]
    return json.loads(buf.getvalue()), counts


def test_lanes_nest_whatever_the_overlap() -> None:
    rng = random.Random(0)
    for _ in range(50):
        start = [rng.uniform(0, 100) for _ in range(40)]
        dur = [rng.uniform(0, 30) for _ in range(40)]
        lanes, durations = assign_lanes(start, dur)
        for lane in set(lanes):
            spans = sorted(
                (start[i], start[i] + durations[i]) for i in range(40) if lanes[i] == lane
            )
            for (s1, e1), (s2, e2) in itertools.pairwise(spans):
                assert s2 >= e1 or e2 <= e1, (lane, (s1, e1), (s2, e2))
        # Durations are only trimmed by clock rounding, never cut short otherwise.
        assert all(d0 - d1 < SLACK_US for d0, d1 in zip(dur, durations, strict=True))


def test_nested_calls_share_a_lane_and_overlapping_ones_do_not() -> None:
    lanes, _ = assign_lanes([0, 1, 2, 5, 6], [10, 3, 1, 8, 1])
    # 0..10 holds 1..4 which holds 2..3; 5..13 overlaps 0..10 partly: a second lane.
    assert lanes[:3] == [0, 0, 0] and lanes[3] == 1 and lanes[4] == 0


def test_a_saved_run_as_a_trace(tmp_path: Path) -> None:
    run = open_run(write_run(tmp_path / "run", 200, spike_at=50, nan_at=120))
    doc, counts = _trace(run)
    by_cat = check_trace(doc)
    assert counts["steps"] == by_cat["step"] == 200
    assert counts["phases"] == by_cat["phase"] == 200 * 5
    traced = len(range(1, 200, 20))
    assert by_cat["forward"] == by_cat["backward"] == traced * 4
    assert by_cat["diagnosis"] == 2
    events = doc["traceEvents"]
    nan = next(e for e in events if e.get("cat") == "diagnosis" and e["name"] == "nan")
    assert nan["args"]["step"] == 120 and nan["s"] == "p"
    step = next(e for e in events if e.get("cat") == "step" and e["args"]["step"] == 120)
    assert step["args"]["loss"] == "nan"  # JSON has no NaN: it says so in words
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and "name" in e["args"]}
    assert {"rank 0", "steps", "forward", "backward", "diagnoses"} <= names
    # Phases fill their step exactly.
    phases = [e for e in events if e.get("cat") == "phase"][:5]
    assert [p["name"] for p in phases] == ["data", "forward", "backward", "other", "optimizer"]
    first = next(e for e in events if e.get("cat") == "step")
    assert sum(p["dur"] for p in phases) == pytest.approx(first["dur"], abs=0.01)


def test_a_window_of_steps(tmp_path: Path) -> None:
    run = open_run(write_run(tmp_path / "run", 200, spike_at=50, nan_at=120))
    doc, counts = _trace(run, (100, 149))
    check_trace(doc)
    assert counts["steps"] == 50
    steps = [e["args"]["step"] for e in doc["traceEvents"] if e.get("cat") == "step"]
    assert min(steps) == 100 and max(steps) == 149
    assert counts["modules"] == len(range(101, 150, 20)) * 8


class _WithCollectives:
    """A saved run plus a python.collectives table as the collectives engineer describes it."""

    SPEC = TableSpec(
        "collectives",
        "one collective call",
        tuple(
            Column(n, t, nullable=n == "duration")
            for n, t in (
                ("rank", "int"),
                ("pg", "str"),
                ("seq", "int"),
                ("op", "str"),
                ("start", "float"),
                ("duration", "float"),
                ("state", "str"),
                ("shapes", "str"),
                ("dtype", "str"),
                ("bytes", "int"),
                ("step", "int"),
                ("site", "str"),
            )
        ),
    )

    def __init__(self, run: object, rows: list[tuple]) -> None:
        self.run = run
        self.collectives = Block.from_rows(self.SPEC, rows)

    def table_names(self) -> list[str]:
        return [*self.run.table_names(), "collectives"]  # type: ignore[attr-defined]

    def block(self, name: str) -> Block:
        return self.collectives if name == "collectives" else self.run.block(name)  # type: ignore[attr-defined]


def test_collectives_go_on_their_own_thread(tmp_path: Path) -> None:
    run = open_run(write_run(tmp_path / "run", 40, spike_at=5, nan_at=30))
    t0 = float(run.block("steps").data["time"][10])
    rows = [
        (
            0,
            "default_pg",
            1,
            "all_reduce",
            t0,
            0.002,
            "completed",
            "[[8]]",
            "float32",
            32,
            10,
            "a.py:3",
        ),
        # An async op that overlaps the first one partly: a second lane.
        (
            0,
            "default_pg",
            2,
            "all_gather",
            t0 + 0.001,
            0.004,
            "completed",
            "[[8]]",
            "float32",
            64,
            10,
            "a.py:4",
        ),
        (
            0,
            "default_pg",
            3,
            "all_reduce",
            t0 + 0.01,
            None,
            "started",
            "[[8]]",
            "float32",
            32,
            11,
            "a.py:3",
        ),
        (  # completed at a moment not seen (a polled work): no duration, but not pending
            0,
            "default_pg",
            4,
            "send",
            t0 + 0.02,
            None,
            "completed",
            "[[8]]",
            "float32",
            32,
            12,
            "a.py:5",
        ),
    ]
    doc, counts = _trace(_WithCollectives(run, rows))
    by_cat = check_trace(doc)
    assert counts["collectives"] == by_cat["collective"] == 4
    events = [e for e in doc["traceEvents"] if e.get("cat") == "collective"]
    done = [e for e in events if e["ph"] == "X"]
    assert [e["args"]["seq"] for e in done] == [1, 2]
    assert done[0]["tid"] != done[1]["tid"]
    hung, sent = (e for e in events if e["ph"] == "i")
    assert hung["name"] == "all_reduce (not finished)" and hung["args"]["state"] == "started"
    assert sent["name"] == "send" and sent["args"]["state"] == "completed"


def test_no_collectives_table_no_collectives_thread(tmp_path: Path) -> None:
    run = open_run(write_run(tmp_path / "run", 40, spike_at=5, nan_at=30))
    doc, counts = _trace(run)
    assert counts["collectives"] == 0
    assert not any(
        e["ph"] == "M" and e["args"].get("name") == "collectives" for e in doc["traceEvents"]
    )
    assert np.isfinite([e["ts"] for e in doc["traceEvents"] if "ts" in e]).all()
