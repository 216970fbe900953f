"""A process that trained nowhere itself says where the training went, rather than only "no
training step was seen": the ranks it launched (their steps and findings, read from its run
directory) or, failing that, the CPU its child processes used, which torchdoctor follows only
when they become ranks (pytorch/examples' mnist_hogwild trains in two such children)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torchdoctor
from torchdoctor.report.summary import render_summary
from torchdoctor.telemetry.run_summary import RankRecord, RunSummary


def test_a_launcher_names_its_ranks_steps_and_findings() -> None:
    ranks = (RankRecord(0, 4), RankRecord(1, 4, ("straggler", "replica_drift")), RankRecord(2, 0))
    text = render_summary(RunSummary(steps=0, run_dir="RUN", ranks=ranks))
    assert "    rank 2: no step recorded\n" in text  # not judged: not "nothing found"
    assert "no training step in this process; the ranks it launched recorded theirs:" in text
    assert "    rank 0: 4 steps, nothing found\n" in text
    assert "    rank 1: 4 steps, found straggler, replica_drift\n" in text
    assert "  the job judged as one: torchdoctor diagnoses RUN" in text
    assert "no training step was seen" not in text and "nothing judged" not in text


def test_children_that_used_the_cpu_are_named_where_nothing_stepped(tmp_path: Path) -> None:
    with torchdoctor.Session(tmp_path / "run", quiet=True) as s:
        idle = render_summary(s.summary())
        burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.2: pass"
        subprocess.run([sys.executable, "-c", burn], check=True, timeout=60)
        busy = render_summary(s.summary())
    assert "child processes" not in idle
    assert "no training step was seen" in busy and "nothing judged" in busy
    used = busy.split("its child processes used ")[1].split(" s of CPU")[0]
    assert 1.2 <= float(used) < 60, busy
    assert "followed only in the ranks of torch.distributed (torchdoctor.start()" in busy
