"""A structural check of Chrome trace-event JSON, the rules Perfetto's and chrome://tracing's
importers rely on: every event names its phase, process and thread; slices have a duration or
a matching end; on each thread, timestamps never go back and slices nest."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

PHASES = {"X", "B", "E", "i", "I", "M", "C"}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}
SLACK_US = 0.002  # timestamps are written with three decimals


def check_trace(doc: Any) -> Counter[str]:
    """Asserts the rules; returns the count of events by category."""
    assert isinstance(doc, dict), "a trace is a JSON object"
    events = doc["traceEvents"]
    assert isinstance(events, list) and events, "traceEvents is a non-empty list"
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    named_threads: set[tuple[int, int]] = set()
    named_processes: set[int] = set()
    counts: Counter[str] = Counter()
    for ev in events:
        ph = ev.get("ph")
        assert ph in PHASES, ev
        assert isinstance(ev.get("pid"), int) and isinstance(ev.get("tid"), int), ev
        assert isinstance(ev.get("name"), str) and ev["name"], ev
        if ph == "M":
            assert ev["name"] in METADATA, ev
            assert isinstance(ev.get("args"), dict), ev
            if ev["name"] == "thread_name":
                named_threads.add((ev["pid"], ev["tid"]))
            if ev["name"] == "process_name":
                named_processes.add(ev["pid"])
            continue
        assert isinstance(ev.get("ts"), (int, float)) and math.isfinite(ev["ts"]), ev
        if ph == "X":
            assert isinstance(ev.get("dur"), (int, float)) and ev["dur"] >= 0, ev
        if ph in ("i", "I"):
            assert ev.get("s", "t") in ("g", "p", "t"), ev
        counts[ev.get("cat", "")] += 1
        tracks[(ev["pid"], ev["tid"])].append(ev)
    for track, evs in tracks.items():
        assert track in named_threads, f"thread {track} has no name"
        assert track[0] in named_processes, f"process {track[0]} has no name"
        last = -math.inf
        open_ends: list[float] = []  # ends of the X slices that hold the current time
        begun: list[str] = []
        for ev in evs:
            ts = float(ev["ts"])
            assert ts >= last, f"time goes back on {track}: {ev}"
            last = ts
            while open_ends and open_ends[-1] <= ts + SLACK_US:
                open_ends.pop()
            if ev["ph"] == "X":
                end = ts + float(ev["dur"])
                if open_ends:
                    assert end <= open_ends[-1] + SLACK_US, f"slices overlap on {track}: {ev}"
                open_ends.append(end)
            elif ev["ph"] == "B":
                begun.append(ev["name"])
            elif ev["ph"] == "E":
                assert begun, f"E without B on {track}: {ev}"
                begun.pop()
        assert not begun, f"B without E on {track}: {begun}"
    return counts
