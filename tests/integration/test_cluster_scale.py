"""A job of 256 ranks reads like one of 2: `cluster backtrace`, `cluster diagnoses` and
`diagnoses JOB_DIR` within a screen (30 lines), job-level findings once, the ranks' own grouped
by what they say, ranks as ranges. The job is simulated (tests/simjob.py): rank directories of
a hung job written by torchdoctor's own writers, and stand-in endpoints, one TCP port per rank
in one process, in place of 256 trainings. How long they take is measured in
benchmarks/cluster_scale.py (docs/benchmarks.md), not here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, wait_for
from simjob import write_job

pytestmark = pytest.mark.slow

WORLD = 256
SCREEN = 30


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("sim")
    live = write_job(root / "live", WORLD)
    stopped = write_job(root / "stopped", WORLD, stopped=True)
    ports = root / "ports.json"
    simjob = Path(__file__).resolve().parent.parent / "simjob.py"
    server = subprocess.Popen([sys.executable, str(simjob), "serve", str(live), str(ports)])
    try:

        def up() -> bool:
            assert server.poll() is None, "the stand-in endpoints exited"
            return ports.exists()

        wait_for(up, 60, "the stand-in endpoints")
        info = json.loads(ports.read_text())
        target = ["-t", f"127.0.0.1:{info['ports'][0]}", "--token", info["tokens"][0]]
        yield {"target": target, "stopped": stopped, "root": root}
    finally:
        server.kill()
        server.wait()


def lines_of(*args: str) -> list[str]:
    out = cli(*args)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) <= SCREEN, out.stdout
    return lines


def heads(lines: list[str]) -> list[str]:
    """The first line of each block: who it is about."""
    return [line for i, line in enumerate(lines) if line and (i == 0 or not lines[i - 1])]


def test_cluster_backtrace_groups_the_ranks(sim: dict[str, Any]) -> None:
    lines = lines_of(*sim["target"], "cluster", "backtrace")
    assert heads(lines) == ["ranks 0-6,8-255: main thread", "rank 7: main thread"]
    text = "\n".join(lines)
    # The waiting ranks' torch frames between the innermost one and the script are one line.
    assert "... 2 frames of torch" in text and "main (" in text
    assert "load_batch (" in text.split("rank 7: main thread")[1]


def test_cluster_diagnoses_says_each_finding_once(sim: dict[str, Any]) -> None:
    lines = lines_of(*sim["target"], "cluster", "diagnoses")
    assert [h.split(" at step")[0] for h in heads(lines)] == [
        "job (found by ranks 0-255): [error] missing_rank",
        "ranks 0-6,8-255: [error] hang",
        "rank 7: [error] hang",
    ]
    text = "\n".join(lines)
    assert "Ranks 0-6,8-255 wait in all_reduce #57" in text
    assert "rank 7 is stuck in your own code in load_batch()" in text
    records = json.loads(cli(*sim["target"], "cluster", "diagnoses", "--format", "json").stdout)
    held = [r for r in records if r["kind"] == "missing_rank"]
    assert len(held) == 1 and held[0]["found_by"] == list(range(WORLD))
    assert held[0]["evidence"]["waiting"] == [r for r in range(WORLD) if r != 7]
    assert sorted(r["rank"] for r in records if r["kind"] == "hang") == list(range(WORLD))


def test_diagnoses_of_the_job_directory(sim: dict[str, Any]) -> None:
    lines = lines_of("diagnoses", str(sim["stopped"]))
    assert [h.split(" at step")[0] for h in heads(lines)] == [
        "job (found by ranks 0-255): [error] missing_rank",
        "job: [info] rank_died",
        "ranks 0-6,8-255: [error] hang",
        "rank 7: [error] hang",
    ]
    text = "\n".join(lines)
    # Stopped by the user afterwards, every rank at once: no rank "died first".
    assert "The job was stopped as a whole: ranks 0-255 ended by SIGTERM" in text
    assert "died first" not in text and "went first" not in text
