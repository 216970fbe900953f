"""A finding that stops being true, on a real run recorded in this process: a plateau flagged
as not_learning, then the loss falls; the finding is resolved at its step in diagnoses.jsonl,
the end-of-run summary, `torchdoctor diagnoses RUN_DIR` and the report."""

from __future__ import annotations

from pathlib import Path

import pytest
from recording import record

from torchdoctor.cli.main import main as cli
from torchdoctor.report.summary import render_summary


def test_a_plateau_that_ends_is_resolved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a plateau of 200 steps of 50 ms: the doctor's passes, about one a second and fewer on a
    # busy machine (a pass may wait a hundred times its cost), see steps 100-200 several times
    recorded = record("plateau_then_learns.py", "--pace", "0.05", run_dir=tmp_path / "run")
    assert recorded.code == 0, recorded.exception
    rows = [r for r in recorded.diagnoses() if r["kind"] == "not_learning"]
    assert rows, "the plateau was not flagged"
    assert rows[0]["resolved"] is None and rows[0]["step"] < 200
    assert rows[-1]["resolved"] is not None and rows[-1]["resolved"] > rows[0]["step"]
    summary = render_summary(recorded.session.summary())
    assert "torchdoctor resolved [not_learning]" in summary
    assert "WARNING [not_learning]" not in summary
    capsys.readouterr()
    assert cli(["diagnoses", str(recorded.run_dir)]) == 0
    text = capsys.readouterr().out
    assert text.count("not_learning") == 1
    assert f"(resolved: no longer holds from step {rows[-1]['resolved']})" in text
    report = tmp_path / "report.html"
    assert cli(["report", str(recorded.run_dir), "-o", str(report)]) == 0
    assert f"Resolved: it no longer holds from step {rows[-1]['resolved']}." in report.read_text()
