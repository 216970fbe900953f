"""Where eval runs, with a real SafePoint drained by a real thread standing for the training."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from helpers import wait_for

from torchdoctor.probe import eval_at
from torchdoctor.telemetry.safe_point import SafePoint
from torchdoctor.telemetry.step_rows import StepHeadline


def _ended(at: float, duration: float) -> StepHeadline:
    """A step that ended at `at` after `duration` seconds."""
    return StepHeadline(step=0, time=at, duration=duration, data_wait=0.0, loss=None, allocated=0)


class Loop:
    """A training loop's step boundary: drains the safe point after each step while running."""

    def __init__(self, step_time: float = 0.001, last_step_ago: float = 0.0) -> None:
        self.safe_point = SafePoint()
        self.last: StepHeadline | None = _ended(time.time() - last_step_ago, step_time)
        self.step_time = step_time
        self.step = 0
        self.stepping = False
        self.thread: threading.Thread | None = None
        self.train_thread: int | None = None
        self.errors: list[BaseException] = []

    def __enter__(self) -> Loop:
        self.stepping = True
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        return self

    def _run(self) -> None:
        self.train_thread = threading.get_ident()
        while self.stepping:
            time.sleep(self.step_time)
            self.last = _ended(time.time(), self.step_time)
            if self.safe_point.pending:
                try:
                    self.safe_point.drain(self.step)
                except BaseException as exc:
                    self.errors.append(exc)
            self.step += 1

    def __exit__(self, *exc: Any) -> None:
        self.stepping = False
        assert self.thread is not None
        self.thread.join()


def _on_thread() -> str:
    return threading.current_thread().name


def test_starting_or_stuck_runs_at_once_on_the_probe_thread() -> None:
    # torch not imported yet: the main thread (this test's) is what the script is doing
    value, where = eval_at.run(_on_thread, "auto", None)
    assert value == threading.current_thread().name
    assert where.note.startswith("ran on the probe thread: the script is still starting (in ")
    assert "test_starting_or_stuck_runs_at_once_on_the_probe_thread() at " in where.note
    start = time.monotonic()
    _value, where = eval_at.run(_on_thread, "auto", Loop(last_step_ago=30.0))
    assert where.where == "probe" and "(no step for 30." in where.note
    assert time.monotonic() - start < eval_at.MIN_WAIT  # no wait for a boundary
    with pytest.raises(eval_at.NoStepBoundary, match="still starting"):
        eval_at.run(_on_thread, "step", None)
    # telemetry is on but no step has ended yet: starting, not stuck
    loop = Loop()
    loop.last = None
    _value, where = eval_at.run(_on_thread, "auto", loop)
    assert where.note.startswith("ran on the probe thread: the script is still starting")


def test_a_stepping_loop_runs_it_at_its_boundary() -> None:
    with Loop() as loop:
        wait_for(lambda: loop.step > 2)
        value, where = eval_at.run(_on_thread, "auto", loop)
        assert value == loop.thread.name  # type: ignore[union-attr]
        assert where.where == "step" and where.after_step is not None
        assert where.note == f"ran at the step boundary after step {where.after_step}"
        value, where = eval_at.run(_on_thread, "now", loop)
        assert value == threading.current_thread().name and where.where == "probe"


def test_no_boundary_in_time_withdraws_the_call(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(eval_at, "MIN_WAIT", 0.05)
    monkeypatch.setattr(eval_at, "STEP_WAIT", 0.05)
    loop = Loop()  # stepped a moment ago, and no more
    _value, where = eval_at.run(_on_thread, "auto", loop)
    assert where.where == "probe" and "no step boundary within 0.1 s" in where.note
    with pytest.raises(eval_at.NoStepBoundary, match="nothing was run"):
        eval_at.run(_on_thread, "step", loop)
    assert not loop.safe_point.pending  # withdrawn: a later step does not run it


def test_ctrl_c_during_the_call_is_the_loops() -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt

    with Loop() as loop:
        with pytest.raises(eval_at.TrainingInterrupted):
            eval_at.run(interrupted, "step", loop)
        wait_for(lambda: loop.errors)
    assert isinstance(loop.errors[0], KeyboardInterrupt)
