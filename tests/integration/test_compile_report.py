"""The torch.compile report: real training loops compiled with backend="eager" on the CPU
(tests/scripts/compile_step.py), recorded through torchdoctor.start() and
telemetry.compile_events.install(), diagnosed by the doctor while they run. Each buggy loop
has its fixed version, which must come out clean, and torchdoctor must not change what the
script prints nor add a graph break or a graph of its own.

The loops are recorded in this process (tests/recording.py: the script's start() finds the
recording's session; Dynamo's caches and counters are reset around each run, as in a new
process); what the script prints with and without torchdoctor is compared in subprocesses,
because torch prints its graph-break warning once per process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import helpers
import pytest
from helpers import script
from recording import Recorded, query, record, saved_diagnoses

SCRIPT = Path(script("compile_step.py"))


def line_of(marker: str) -> int:
    return helpers.line_of("compile_step.py", marker)


def run(cwd: Path, *args: str) -> Recorded:
    recorded = record(SCRIPT, *args, run_dir=cwd / "run", quiet=False)
    assert recorded.code == 0, recorded.stderr[-3000:]
    return recorded


def process(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def diagnoses(cwd: Path) -> list[dict[str, Any]]:
    return saved_diagnoses(cwd / "run")


def compile_rows(cwd: Path) -> list[dict[str, Any]]:
    sql = "SELECT step, kind, function, location, reason, count FROM python.compile"
    return query(cwd / "run", sql)


def compile_findings(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in found if d["kind"] in ("graph_break", "recompilation")]


@pytest.mark.slow
def test_graph_breaks_in_the_step_and_the_fix(tmp_path: Path) -> None:
    where = f"{SCRIPT}:{line_of('# the bug: a print and .item()')}"
    run(tmp_path / "bug", "graph_break")
    (finding,) = compile_findings(diagnoses(tmp_path / "bug"))
    assert finding["kind"] == "graph_break" and finding["severity"] == "warning"
    assert finding["location"] == where
    assert "train_step()" in finding["summary"] and ".item()" in finding["summary"]
    assert "print" in finding["summary"]
    assert any("outside" in fix for fix in finding["fix"].splitlines())
    rows = compile_rows(tmp_path / "bug")
    breaks = [r for r in rows if r["kind"] == "graph_break"]
    assert breaks and {r["location"] for r in breaks} == {where}
    assert any("item()" in r["reason"] for r in breaks)
    assert {r["function"] for r in breaks} >= {"train_step"}

    run(tmp_path / "fixed", "graph_break", "--fixed")
    assert compile_findings(diagnoses(tmp_path / "fixed")) == []
    assert [r["kind"] for r in compile_rows(tmp_path / "fixed")] == ["compile"]


@pytest.mark.slow
def test_graph_break_output_is_the_plain_scripts(env: dict[str, str], tmp_path: Path) -> None:
    # What the script prints (stdout) is what it prints without torchdoctor; torch's own
    # warning about the break is still on stderr, once, as without it.
    bug = process(env, tmp_path / "bug", "graph_break")
    plain = process(env, tmp_path / "plain", "graph_break", "--plain")
    assert bug.stdout == plain.stdout
    warning = "Graph break from `Tensor.item()`"
    assert bug.stderr.count(warning) == plain.stderr.count(warning) == 1
    assert list((tmp_path / "bug" / "torchdoctor-runs").iterdir())  # it was recorded


@pytest.mark.slow
def test_recompilation_storm_and_the_fix(tmp_path: Path) -> None:
    call = f"{SCRIPT}:{line_of('loss = F.mse_loss(forward(x), y)')}"
    bug = run(tmp_path / "bug", "recompiles")
    assert "graphs 8" in bug.stdout  # the recompile limit: 8 graphs, then eager
    found = {d["severity"]: d for d in compile_findings(diagnoses(tmp_path / "bug"))}
    storm = found["error"]
    assert storm["kind"] == "recompilation" and storm["location"] == call
    evidence = (
        json.loads(storm["evidence"]) if isinstance(storm["evidence"], str) else storm["evidence"]
    )
    assert evidence["limit_hit"] and evidence["recompilations"] == 7
    assert evidence["guard"] == "tensor 'x' size mismatch at index 0. expected *, actual *"
    assert evidence["values"][:3] == ["32", "29", "24"]
    assert "batch size" in storm["summary"] and "mlp()" in storm["summary"]
    fixes = storm["fix"].splitlines()
    assert "mark_dynamic(x, 0)" in fixes[0] and any("drop_last" in f for f in fixes)
    kinds = [r["kind"] for r in compile_rows(tmp_path / "bug")]
    assert kinds.count("recompile") == 7 and kinds.count("recompile_limit") == 1

    fixed = run(tmp_path / "fixed", "recompiles", "--fixed")
    assert "graphs 1" in fixed.stdout
    assert compile_findings(diagnoses(tmp_path / "fixed")) == []


@pytest.mark.slow
def test_clean_compiled_script(tmp_path: Path) -> None:
    out = run(tmp_path, "clean")
    assert "graph breaks 0" in out.stdout and "graphs 1" in out.stdout  # none added by us
    assert [d for d in diagnoses(tmp_path) if d["severity"] != "info"] == []
    assert [(r["kind"], r["function"]) for r in compile_rows(tmp_path)] == [
        ("compile", "train_step")
    ]


@pytest.mark.slow
def test_a_script_that_never_compiles(tmp_path: Path) -> None:
    # torch.optim imports torch._dynamo by itself here, so the hooks attach; they only act
    # when Dynamo compiles, which this script never does.
    out = run(tmp_path, "eager")
    assert "dynamo imported True" in out.stdout
    assert compile_rows(tmp_path) == []
    assert compile_findings(diagnoses(tmp_path)) == []


@pytest.mark.slow
def test_compiled_module_gets_no_graph_break_from_torchdoctor(tmp_path: Path) -> None:
    out = run(tmp_path, "module")
    assert "graph breaks 0" in out.stdout and "graphs 1" in out.stdout
