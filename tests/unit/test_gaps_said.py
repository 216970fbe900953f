"""A part of torchdoctor that failed while it recorded is kept in meta.json (`failures`), and
whatever reads the run then says that the record is not whole: the end-of-run summary, every
verb that opens the saved run (a warning), `diagnoses` of the saved run and of the live process
(never a bare "no problems found")."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from recording import td
from torch import nn

import torchdoctor
from torchdoctor.report.diagnoses import INCOMPLETE
from torchdoctor.report.summary import render_summary
from torchdoctor.store import rundir
from torchdoctor.store.saved import open_run


def _train(steps: int) -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()


def test_a_failed_part_is_kept_and_said_by_every_reader(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    with torchdoctor.Session(run_dir, quiet=True) as s:
        _train(3)
        assert s.telemetry is not None
        s.telemetry.silent.fail(RuntimeError("planted"))  # the checks' own failure path
        _train(3)
        summary = render_summary(s.summary())
    said = "silent-error checks failed (RuntimeError: planted) and was switched off"
    assert [f for f in rundir.read_meta(run_dir)["failures"] if said in f]
    assert f"  {INCOMPLETE}: 1 part(s) of torchdoctor failed while it recorded" in summary
    assert "no problems found\n" not in summary + "\n"
    assert any(said in w for w in open_run(run_dir).warnings)
    out = td("diagnoses", run_dir)
    assert out.returncode == 0 and said in out.stderr
    assert out.stdout.startswith(INCOMPLETE) and "no problems found\n" not in out.stdout + "\n"


def test_the_live_process_says_what_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sockets = tempfile.mkdtemp(prefix="td-")  # short: Unix socket paths are limited
    monkeypatch.setenv("TORCHDOCTOR_SOCKET_DIR", sockets + "/s")
    try:
        with torchdoctor.Session(tmp_path / "run", quiet=True) as s:
            _train(3)
            whole = td(str(os.getpid()), "diagnoses")  # the live process, over its socket
            assert s.telemetry is not None
            s.telemetry.silent.fail(RuntimeError("planted"))
            _train(3)
            out = td(str(os.getpid()), "diagnoses")
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    assert (whole.returncode, whole.stdout.strip(), whole.stderr) == (0, "no problems found", "")
    assert out.returncode == 0, out.stderr
    assert "in the running process, silent-error checks failed (RuntimeError: planted)" in (
        out.stderr
    )
    assert out.stdout.startswith(INCOMPLETE) and "no problems found\n" not in out.stdout + "\n"


def test_a_whole_record_is_free_of_problems_as_before(tmp_path: Path) -> None:
    with torchdoctor.Session(tmp_path / "run", quiet=True) as s:
        _train(3)
        summary = render_summary(s.summary())
    assert "  no problems found" in summary
    assert "failures" not in rundir.read_meta(tmp_path / "run")
    assert td("diagnoses", tmp_path / "run").stdout.strip() == "no problems found"


def test_the_report_says_the_record_is_not_whole(tmp_path: Path) -> None:
    with torchdoctor.Session(tmp_path / "run", quiet=True) as s:
        _train(3)
        assert s.telemetry is not None
        s.telemetry.silent.fail(RuntimeError("planted"))
        _train(3)
    out = td("report", tmp_path / "run", "-o", tmp_path / "report.html")
    assert out.returncode == 0, out.stderr
    page = (tmp_path / "report.html").read_text()
    assert "Read with warnings" in page and "RuntimeError: planted" in page
    assert INCOMPLETE.capitalize() in page and "No problems found." not in page
