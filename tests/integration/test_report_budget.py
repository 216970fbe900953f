"""The size budget of a report: a million-step run (written with the project's own segment
writer) makes a page under 5 MB that still holds every diagnosed step and the extremes. Time
is measured in benchmarks/report.py, not asserted here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from recording import td
from synthetic import write_run

BUDGET_BYTES = 5_000_000


@pytest.mark.slow
def test_a_million_steps_fit_in_five_megabytes(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", 1_000_000, spike_at=412_345, nan_at=777_777)
    page = tmp_path / "report.html"
    out = td("report", run, "-o", page)  # the verb in this process
    assert out.returncode == 0, out.stderr
    size = page.stat().st_size
    assert size < BUDGET_BYTES, f"{size:,} bytes"
    m = re.search(r'id="td-digest">(.*?)</script>', page.read_text(), re.S)
    assert m is not None
    digest = json.loads(m.group(1))
    assert digest["summary"]["steps"] == 1_000_000
    for chart in ("training", "phases", "memory"):
        assert {412_345, 777_777} <= set(digest[chart]["step"]), chart
        assert digest[chart]["kept"] < 5_000
    phases = digest["phases"]
    assert max(phases["duration"]) == 2.5  # the stall, at its real height
    assert digest["training"]["nonfinite"]["loss"] == [777_777]
    assert {d["step"] for d in digest["diagnoses"]} == {412_345, 777_777}
