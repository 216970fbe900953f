"""Where the step time went: python.steps's phases with torch.compile's compile time taken out
of the phase it happened in, or added before the step when the step could not hold it; the
summary and the report say evaluation and compile only when a run has some, and an empty
per-module chart says why."""

from __future__ import annotations

import numpy as np

from torchdoctor.digest import time_split
from torchdoctor.digest.record import GradHeatmap, SlowModules
from torchdoctor.report.html import _heatmap_note, _modules_note
from torchdoctor.report.summary import render_summary
from torchdoctor.telemetry.run_summary import RunSummary


def _steps(**columns: list[float]) -> dict[str, np.ndarray]:
    base = {p: [0.0, 0.0, 0.0] for p in ("data_wait", "forward", "backward", "optimizer", "other")}
    base.update(columns)
    return {k: np.array(v, dtype=float) for k, v in base.items()}


def test_compile_inside_a_step_is_taken_out_of_its_phases() -> None:
    steps = _steps(forward=[0.5, 0.1, 0.1], backward=[0.2, 0.2, 0.2], other=[0.1, 0.1, 0.1])
    duration = np.array([0.8, 0.4, 0.4])
    # a recompilation of 0.6 s in step 0: the forward holds 0.5 of it, the backward the rest
    bands, durations = time_split.split(steps, duration, np.array([0.6, 0.0, 0.0]))
    assert list(bands) == list(time_split.SHOWN)
    assert bands["compile"].tolist() == [0.6, 0.0, 0.0]
    assert np.allclose(bands["forward"], [0.0, 0.1, 0.1])
    assert np.allclose(bands["backward"], [0.1, 0.2, 0.2])
    assert durations.tolist() == duration.tolist()  # all of it was inside the step
    total = sum(bands[p] for p in time_split.SHOWN)
    assert np.allclose(total, [0.8 - 0.0, 0.4, 0.4])  # the bands add up to the duration


def test_compile_the_step_cannot_hold_came_before_it() -> None:
    # The first call of a compiled model: 2 s of compiling before the step's first event.
    steps = _steps(forward=[0.0, 0.1, 0.1], backward=[0.01, 0.01, 0.01], other=[0.01, 0.09, 0.09])
    bands, durations = time_split.split(steps, np.array([0.02, 0.2, 0.2]), np.array([2.0, 0, 0]))
    assert bands["compile"].tolist() == [2.0, 0.0, 0.0]
    assert np.allclose(durations, [2.0, 0.2, 0.2])  # 0.02 inside the step, 1.98 before it
    assert np.allclose(sum(bands[p] for p in time_split.SHOWN), durations)


def test_a_column_saved_before_it_existed_reads_as_zero() -> None:
    steps = _steps(forward=[0.1, 0.1, 0.1])
    steps["evaluation"] = np.array([np.nan, np.nan, np.nan])  # an old run's NULL
    bands, _durations = time_split.split(steps, np.full(3, 0.1), np.zeros(3))
    assert bands["evaluation"].tolist() == [0.0, 0.0, 0.0]


def test_compile_by_step() -> None:
    steps = np.array([0, 1, 2, 5])
    at = np.array([-1, 0, 2, 3, 5])  # -1: NULL, before the first step; 3: a step not shown
    seconds = np.array([1.0, 0.5, 0.25, 8.0, 0.125])
    assert time_split.by_step(steps, at, seconds).tolist() == [1.5, 0.0, 0.25, 0.125]


def _summary(**phases: float) -> str:
    base = dict.fromkeys(time_split.SHOWN, 0.0)
    base.update(phases)
    return render_summary(
        RunSummary(steps=10, duration=sum(base.values()), phases=base, run_dir="RUN")
    )


def test_the_summary_names_evaluation_and_compile_when_there_are_some() -> None:
    plain = _summary(forward=0.5, backward=0.5)
    assert "  time: data 0%, forward 50%, backward 50%, optimizer 0%, other 0%" in plain
    both = _summary(forward=0.25, evaluation=0.25, compile=0.25, backward=0.25)
    assert (
        "  time: data 0%, forward 25%, evaluation 25%, compile 25%, backward 25%, optimizer 0%, "
        "other 0%"
    ) in both


def test_an_empty_per_module_chart_says_why() -> None:
    empty_modules = SlowModules(0, [], 0)
    empty_heat = GradHeatmap(0, [], 1, [], [], 0)
    assert "torch.compile" in _modules_note(empty_modules, "compile")
    assert "torch.compile" in _heatmap_note(empty_heat, "compile")
    assert "ended before step 1" in _modules_note(empty_modules, "short")
    assert "--trace-every 0" in _heatmap_note(empty_heat, "off")


def test_a_run_without_steps_is_never_called_free_of_problems() -> None:
    # Nothing was judged: the summary says so rather than "no problems found" over the gap.
    text = render_summary(RunSummary(steps=0, run_dir="RUN"))
    assert "no training step was seen" in text and "no problems found" not in text
    assert "  nothing judged: the training diagnoses need recorded steps" in text
    assert "  no problems found" in _summary(forward=0.5, backward=0.5)
