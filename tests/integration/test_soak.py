"""A long run of tiny steps keeps the probe's memory and the run directory flat once the
tables are full (the full million-step soak is benchmarks/soak.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import script, td_run, wait_for
from recording import query

ROWS = 2000  # TORCHDOCTOR_MAX_ROWS: every table full well before the first checkpoint
CHECKPOINTS = (12_000, 24_000)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _saved(run_dir: Path, sql: str) -> list[dict]:
    return query(run_dir, sql)  # read here: a CLI process per poll would take the cores


@pytest.mark.slow
def test_memory_and_run_directory_stay_flat(launch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "run"
    points = ",".join(str(c) for c in CHECKPOINTS)
    argv = ["--steps", str(CHECKPOINTS[-1]), "--checkpoints", points]
    run = launch(
        td_run("--quiet", "--run-dir", str(d), script("tiny_steps.py"), *argv),
        extra_env={"TORCHDOCTOR_MAX_ROWS": str(ROWS)},
    )
    measured = {}
    for n in CHECKPOINTS:
        wait_for(lambda n=n: f"checkpoint {n}" in run.stdout(), timeout=600, what=f"step {n}")
        # Everything up to the checkpoint is on disk (the spill runs every second).
        wait_for(
            lambda n=n: _saved(d, "SELECT max(step) AS s FROM python.steps")[0]["s"] == n - 1,
            what=f"step {n} saved",
        )
        measured[n] = (_rss(run.pid), _size(d))
        (run.cwd / f"go-{n}").touch()
    assert run.wait(120) == 0, run.output()
    (rss_a, size_a), (rss_b, size_b) = measured[CHECKPOINTS[0]], measured[CHECKPOINTS[1]]
    print(f"rss {rss_a / 2**20:.1f} -> {rss_b / 2**20:.1f} MiB; dir {size_a} -> {size_b} bytes")
    assert rss_b - rss_a < 4 * 2**20  # 12,000 more steps: no more memory
    # nor more disk: a table keeps its capacity plus at most two files of a quarter of it, so
    # a flat directory varies by up to half with the phase of its rotation; growing, it doubles
    assert size_b < 1.6 * size_a
    # What is on disk is the newest rows, each once, and `query RUN_DIR` reads them.
    steps = [r["step"] for r in _saved(d, "SELECT step FROM python.steps ORDER BY step")]
    assert ROWS <= len(steps) <= 3 * ROWS
    assert steps == list(range(CHECKPOINTS[-1] - len(steps), CHECKPOINTS[-1]))
    traced = _saved(d, "SELECT count(*) AS n, max(step) AS s FROM python.torch_trace")[0]
    assert ROWS <= traced["n"] <= 3 * ROWS and traced["s"] >= CHECKPOINTS[-1] - 20
