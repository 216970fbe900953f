"""The transformers Trainer with TorchdoctorCallback: a tiny GPT-2 from a config (no download),
trained for real in a subprocess."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, script

pytestmark = pytest.mark.slow
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _train(launch: Any, out: Path, *args: str, extra_env: dict[str, str] | None = None) -> Any:
    argv = [sys.executable, script("hf_train.py"), "--out", str(out), *args]
    run = launch(argv, extra_env={**OFFLINE, **(extra_env or {})})
    assert run.wait(300) == 0, run.output()
    return run, json.loads(run.stdout().strip().splitlines()[-1])


def _steps(run_dir: str, env: dict[str, str]) -> list[dict[str, Any]]:
    sql = "SELECT step, micro_batches FROM python.steps ORDER BY step"
    out = cli("query", run_dir, sql, "--format", "json", env=env)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


def test_trainer_steps_diagnoses_and_report(launch, env, tmp_path) -> None:
    out = tmp_path / "out"
    run, result = _train(launch, out, "--steps", "3", "--accum", "2", "--plant-nan")
    run_dir = Path(result["run_dir"])
    assert run_dir.parent == out / "torchdoctor-runs"

    # One row per optimizer step of the Trainer, each with its two accumulated micro-batches.
    steps = _steps(str(run_dir), env)
    assert len(steps) == result["global_step"] == 3
    assert [s["micro_batches"] for s in steps] == [2, 2, 2]

    # The NaN diagnosis reached the Trainer: its log history and the transformers logger.
    found = [e for e in result["log_history"] if "torchdoctor_kind" in e]
    assert [e["torchdoctor_kind"] for e in found] == ["nan"], found
    assert found[0]["torchdoctor_location"] == "transformer.wte"
    assert found[0]["torchdoctor_severity"] == "error"
    stderr = run.stderr()
    assert stderr.count("torchdoctor ERROR [nan]") == 1, stderr  # the logger's, no second alert
    assert "[transformers] torchdoctor ERROR [nan]" in stderr

    # The report, written at the end, in the run directory.
    report = Path(result["report"])
    assert report == run_dir / "report.html"
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>") and "transformer.wte" in page
    assert {"torchdoctor_report": str(report), "step": 3} in result["log_history"]


def test_trainer_under_a_running_probe_keeps_its_run_dir(launch, env, tmp_path) -> None:
    out = tmp_path / "out"
    _, result = _train(launch, out, "--steps", "2", "--accum", "3", extra_env={"TORCHDOCTOR": "1"})
    run_dir = Path(result["run_dir"])
    assert run_dir.parent == tmp_path / "torchdoctor-runs"  # the probe's own, from the start
    assert not (out / "torchdoctor-runs").exists()
    steps = _steps(str(run_dir), env)
    assert [s["micro_batches"] for s in steps] == [3, 3]
    assert result["global_step"] == 2
    assert not [e for e in result["log_history"] if "torchdoctor_kind" in e]
    assert Path(result["report"]) == run_dir / "report.html"
    assert Path(result["report"]).exists()
