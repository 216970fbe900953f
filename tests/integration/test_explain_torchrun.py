"""`torchdoctor explain` on the logs of real 2-rank torchrun jobs (gloo, CPU) in which one rank
fails (an exception, or gloo's abort) and the other only loses its peer: the answer is the
failed rank's error, with its line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cli, free_port, script


@pytest.mark.slow
def test_explain_reads_a_live_torchrun_log(env: dict[str, str], tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc_per_node=2", f"--master_port={free_port()}"]
    cmd += [script("dist_rank_fails.py"), "shape"]
    job = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert job.returncode != 0
    log = job.stdout + job.stderr
    assert "ChildFailedError" in log and "[rank1]:" in log, log[-3000:]
    (tmp_path / "job.log").write_text(log)
    out = cli("explain", str(tmp_path / "job.log"), "--format", "json", env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["category"] == "shape.matmul" and data["rank"] == 1, data["summary"]
    line = log.splitlines()[data["line"] - 1]
    assert line.startswith("[rank1]:") and "mat1 and mat2 shapes" in line
    assert data["fields"]["location"].endswith("in main")


@pytest.mark.slow
def test_explain_names_the_rank_gloo_aborted(env: dict[str, str], tmp_path: Path) -> None:
    # Rank 1 all-reduces 64 elements, rank 0 one: gloo aborts rank 0 (SIGABRT, no prefixed
    # line of its own) and rank 1 loses its peer. The answer is rank 0's abort. The agent looks
    # at its workers every 0.1 s by default and then ends rank 1, sometimes before rank 1 has
    # printed the error it got: every 3 s lets rank 1 print it and exit on its own.
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc_per_node=2", f"--master_port={free_port()}"]
    cmd += ["--monitor-interval=3"]
    cmd += [script("dist_rank_fails.py"), "sizes"]
    job = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    log = job.stdout + job.stderr
    assert job.returncode != 0 and "SIGABRT" in log and "EnforceNotMet" in log, log[-3000:]
    (tmp_path / "job.log").write_text(log)
    out = cli("explain", str(tmp_path / "job.log"), "--format", "json", env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["category"], data["rank"]) == ("dist.collective_mismatch", 0), data["summary"]
    assert "collective mismatch" in log.splitlines()[data["line"] - 1]
    assert ("dist.peer_lost", 1) in [(a["category"], a["rank"]) for a in data["also"]]
