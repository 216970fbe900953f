"""The transformers Trainer with TorchdoctorCallback: a tiny GPT-2 from a config (no download),
trained for real in this process (tests/recording.py): the callback starts and stops its own
session, or finds the one already running."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from recording import Recorded, execute, query, record

pytestmark = pytest.mark.slow
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _result(run: Recorded) -> Any:
    assert run.code == 0, run.output()
    return json.loads(run.stdout.strip().splitlines()[-1])


def _steps(run_dir: str) -> list[dict[str, Any]]:
    return query(run_dir, "SELECT step, micro_batches FROM python.steps ORDER BY step")


def test_trainer_steps_diagnoses_and_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    argv = ("--out", str(out), "--steps", "3", "--accum", "2", "--plant-nan")
    run = execute("hf_train.py", *argv, cwd=tmp_path, env=OFFLINE)
    result = _result(run)
    run_dir = Path(result["run_dir"])
    assert run_dir.parent == out / "torchdoctor-runs"
    assert run.run_dir is None  # the callback's session was stopped by the callback

    # One row per optimizer step of the Trainer, each with its two accumulated micro-batches.
    steps = _steps(str(run_dir))
    assert len(steps) == result["global_step"] == 3
    assert [s["micro_batches"] for s in steps] == [2, 2, 2]

    # The NaN diagnosis reached the Trainer: its log history and the transformers logger.
    found = [e for e in result["log_history"] if "torchdoctor_kind" in e]
    assert [e["torchdoctor_kind"] for e in found] == ["nan"], found
    assert found[0]["torchdoctor_location"] == "transformer.wte"
    assert found[0]["torchdoctor_severity"] == "error"
    stderr = run.stderr
    assert stderr.count("torchdoctor ERROR [nan]") == 1, stderr  # the logger's, no second alert
    assert "[transformers] torchdoctor ERROR [nan]" in stderr

    # The report, written at the end, in the run directory.
    report = Path(result["report"])
    assert report == run_dir / "report.html"
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and "transformer.wte" in page
    assert {"torchdoctor_report": str(report), "step": 3} in result["log_history"]


def test_trainer_under_a_running_probe_keeps_its_run_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # the session a TORCHDOCTOR=1 start-up would have started, in its default directory
    out = tmp_path / "out"
    argv = ("--out", str(out), "--steps", "2", "--accum", "3")
    run = record("hf_train.py", *argv, run_dir=None, cwd=tmp_path, env=OFFLINE)
    result = _result(run)
    run_dir = Path(result["run_dir"])
    assert run_dir == run.run_dir
    assert run_dir.parent == tmp_path / "torchdoctor-runs"  # the probe's own, from the start
    assert not (out / "torchdoctor-runs").exists()
    steps = _steps(str(run_dir))
    assert [s["micro_batches"] for s in steps] == [3, 3]
    assert result["global_step"] == 2
    assert not [e for e in result["log_history"] if "torchdoctor_kind" in e]
    assert Path(result["report"]) == run_dir / "report.html"
    assert Path(result["report"]).exists()
