"""Phases that are true for any loop shape, on real loops recorded in this process: forward is
the time inside the model's top-level calls; what runs between the model's return and
backward() is not forward; input that does not come through a DataLoader (nanoGPT's
`get_batch` between forward and backward, a generator of the loop's own) is found by stack
samples of the gaps, counted as data_wait from then on, and named by dataloader_bound with the
line that calls it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import SCRIPTS
from recording import record

from torchdoctor.store.saved import open_run


def _recorded(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[Any, dict[str, list[float]], list[dict[str, Any]]]:
    recorded = record(name, *args, run_dir=tmp_path / "run")
    assert recorded.code == 0, recorded.exception
    said = json.loads(recorded.stdout.strip().splitlines()[-1])
    return open_run(recorded.run_dir), said, recorded.diagnoses()


def _samples(run: Any) -> dict[str, Any]:
    events = [e for e in run.block("events").to_records() if e["kind"] == "gap_samples"]
    assert events, "no stack samples were taken"
    found = json.loads(events[-1]["data"])
    assert "input" in found, json.dumps(found, indent=1)
    return found


def _line(script: str, text: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_get_batch_between_forward_and_backward_is_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 500 steps of ~8 ms: on a busy machine the samples may name the input only late, and the
    # steps after that are what is judged (300 left none once, under the full suite's load)
    run, said, found = _recorded("input_get_batch.py", tmp_path, capsys, "--steps", "500")
    steps = run.block("steps").data
    # Forward is the model's call, not the fetch after it (it was 5-8x the model before).
    assert steps["forward"].sum() < 1.5 * sum(said["model"]) + 0.02
    assert steps["forward"].sum() < 0.5 * sum(said["fetch"])
    samples = _samples(run)
    where = samples["input"]
    assert where["function"] == "get_batch"
    assert where["site"].endswith(f"input_get_batch.py:{_line('input_get_batch.py', '    X, Y')}")
    assert where["gaps"]["forward"] >= 0.9  # the gap after the model's return
    # From the step it was found on, the fetch is data_wait (row N's gap holds fetch N).
    start = where["from_step"] + 1
    assert start <= len(steps["step"]) - 50, f"the input was named only at step {start - 1}"
    booked = float(steps["data_wait"][start:].sum())
    fetched = sum(said["fetch"][start:])
    assert booked == pytest.approx(fetched, rel=0.15)
    assert float(np.median(steps["other"][start:])) < 0.25 * float(np.median(said["fetch"]))
    bound = [d for d in found if d["kind"] == "dataloader_bound"][-1]
    assert bound["severity"] == "warning"
    assert "get_batch()" in bound["summary"] and "not through a DataLoader" in bound["summary"]
    assert bound["location"] == where["site"]
    assert "IterableDataset" in bound["fix"]


def test_a_generator_of_the_loop_is_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 800 steps of ~9 ms: the doctor's first look after its warm-up, a window of samples and
    # a window of rows judged after it, with room for a busy machine
    run, said, found = _recorded("input_generator.py", tmp_path, capsys, "--steps", "800")
    where = _samples(run)["input"]
    assert where["function"] == "batches"
    assert where["code"] == "x, y = next(stream)"
    assert where["gaps"]["start"] >= 0.8  # the gap that opens the step
    steps = run.block("steps").data
    start = where["from_step"] + 1
    assert start <= len(steps["step"]) - 50, f"the input was named only at step {start - 1}"
    booked = float(steps["data_wait"][start:].sum())
    assert booked == pytest.approx(sum(said["fetch"][start:]), rel=0.2)
    bound = [d for d in found if d["kind"] == "dataloader_bound"][-1]
    assert bound["location"].endswith(f"input_generator.py:{_line('input_generator.py', 'next(')}")


def test_time_no_phase_claims_is_named_where_it_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A loop whose steps spend most of their time in work of its own that is not its input
    (a metrics call after each update): not data, and not "no problems found" either."""
    # 500 steps of about 12 ms: the doctor's first look, then a window of samples, with room
    # for a busy machine
    _run, _said, found = _recorded(
        "input_get_batch.py",
        tmp_path,
        capsys,
        *("--steps", "500", "--delay", "0", "--metrics-delay", "0.01"),
    )
    assert not [d for d in found if d["kind"] == "dataloader_bound"], found
    said = [d for d in found if d["kind"] == "unattributed_time"][-1]
    assert said["severity"] == "info"
    assert "mostly in log_metrics()" in said["summary"], said["summary"]
    assert said["location"].endswith(
        f"input_get_batch.py:{_line('input_get_batch.py', '  log_metrics(loss)')}"
    )
    assert "bookkeeping" in said["fix"] and "every N" in said["fix"]


def test_a_short_run_says_what_its_unclaimed_time_is_or_that_it_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """15 steps with a slow fetch, over before the doctor has looked (or just after): either
    the sampler's window, judged at the run's end, found get_batch, or the time is said to be
    unknown; never nothing."""
    _run, _said, found = _recorded(
        "input_get_batch.py", tmp_path, capsys, "--steps", "15", "--delay", "0.02"
    )
    kinds = {d["kind"]: d for d in found}
    if "dataloader_bound" in kinds:
        assert "get_batch()" in kinds["dataloader_bound"]["summary"]
    else:
        unknown = kinds["unattributed_time"]["summary"]
        assert "was not sampled" in unknown and "not known" in unknown, unknown
        assert "backtrace" in kinds["unattributed_time"]["fix"]
