"""Memory by phase as records: the rows of python.memory made into PhaseMemory (what each phase
added, the step's highest), written in the form an out-of-memory diagnosis stores, and read
back from that form (PhaseMemory.from_json), a row stored without `peak` included."""

from __future__ import annotations

from torchdoctor._json import dumps
from torchdoctor.memory.phases import PhaseMemory, phase_rows
from torchdoctor.report.memory import render_phases


def _row(phase: str, allocated: int, step: int | None = 3) -> dict[str, object]:
    return {"step": step, "phase": phase, "allocated": allocated,
            "max_allocated": allocated + 1, "reserved": 4096}  # fmt: skip


def test_phase_rows_say_what_each_added_and_which_is_highest() -> None:
    rows = phase_rows([_row("setup", 100, None), _row("forward", 300), _row("backward", 200)])
    assert [p.added for p in rows] == [None, 200, -100]
    assert [p.peak for p in rows] == [False, True, False]
    stored = [p.to_json() for p in rows]
    assert list(stored[1]) == [
        "step", "phase", "allocated", "max_allocated", "reserved", "added", "peak"
    ]  # fmt: skip
    assert [PhaseMemory.from_json(p) for p in stored] == rows


def test_setup_alone_has_no_peak_and_reads_back() -> None:
    (setup,) = phase_rows([_row("setup", 100, None)])
    assert setup.peak is None and "peak" not in setup.to_json()
    assert dumps(setup) == dumps(PhaseMemory.from_json(setup.to_json()))
    text = render_phases([PhaseMemory.from_json({"phase": "forward", "step": 2,
                                                 "allocated": 2048, "max_allocated": 4096,
                                                 "reserved": 8192})])  # fmt: skip
    assert text.startswith("memory by phase (step 2, the last traced step)")
    assert "<- highest" not in text
