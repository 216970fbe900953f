"""The Lightning Trainer with TorchdoctorCallback and a CSVLogger, trained for real in this
process (tests/recording.py: the callback starts and stops its own session); and
step(closure), which Lightning uses, in plain torch."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from recording import execute, query


def _query(run_dir: str, sql: str) -> list[dict]:
    return query(run_dir, sql)


def _same(a: object, b: object) -> bool:
    fa = math.nan if a == "nan" else float(a)  # type: ignore[arg-type]
    fb = math.nan if b == "nan" else float(b)  # type: ignore[arg-type]
    return (math.isnan(fa) and math.isnan(fb)) or math.isclose(fa, fb, rel_tol=1e-5)


@pytest.mark.slow
def test_lightning_steps_diagnoses_logger_and_report(tmp_path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    argv = ("--root", str(root), "--steps", "4", "--accum", "2", "--lr", "1e4")
    run = execute("lightning_train.py", *argv, cwd=tmp_path)
    assert run.code == 0, run.output()
    assert run.run_dir is None  # the callback's session was stopped by the callback
    result = json.loads(run.stdout.strip().splitlines()[-1])
    run_dir = Path(result["run_dir"])
    assert run_dir.parent == Path(result["log_dir"]) / "torchdoctor-runs"

    # Steps are the Trainer's optimizer steps, two accumulated micro-batches each; the gradient
    # norm is that of the update (checked after Lightning's closure ran backward).
    steps = _query(str(run_dir), "SELECT * FROM python.steps ORDER BY step")
    assert len(steps) == result["global_step"] == 4
    assert [s["micro_batches"] for s in steps] == [2, 2, 2, 2]
    norms = [s["grad_norm"] for s in steps]
    assert all(_same(a, b) for a, b in zip(norms, result["grad_norms"], strict=True)), (
        norms,
        result["grad_norms"],
    )
    assert all(s["forward"] > 0 for s in steps)  # the module's calls were found and timed

    # The diagnosis reached the logger (CSV columns) and Lightning's Python logger, once.
    with open(Path(result["log_dir"]) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    logged = [r for r in rows if r.get("torchdoctor/nan")]
    assert logged and float(logged[0]["torchdoctor/nan"]) == 3.0  # severity: error
    assert float(logged[0]["torchdoctor/diagnoses"]) >= 1
    assert run.stderr.count("torchdoctor ERROR [nan]") == 1, run.stderr

    report = Path(result["report"])
    assert report == run_dir / "report.html"
    assert report.read_text().startswith("<!DOCTYPE html>")


CLOSURE_SCRIPT = """
import json, torch, torchdoctor
session = torchdoctor.start(quiet=True)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
norms = []
def closure():
    optimizer.zero_grad()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    norms.append(float(torch.cat([p.grad.flatten() for p in model.parameters()]).norm()))
    return loss
for i in range(3):
    optimizer.step(closure) if i % 2 else optimizer.step(closure=closure)
torchdoctor.stop()
print(json.dumps({"run_dir": str(session.run_dir), "norms": norms}))
"""


def test_step_with_a_closure_checks_the_gradients_it_made(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "closure.py"
    path.write_text(CLOSURE_SCRIPT)
    run = execute(path, cwd=tmp_path)
    assert run.code == 0, run.output()
    assert run.run_dir is None  # stopped by the script itself
    result = json.loads(run.stdout.strip().splitlines()[-1])
    steps = _query(result["run_dir"], "SELECT grad_norm, micro_batches FROM python.steps")
    assert [s["micro_batches"] for s in steps] == [1, 1, 1]
    assert all(_same(s["grad_norm"], n) for s, n in zip(steps, result["norms"], strict=True))
