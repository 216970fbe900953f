"""Which probed process a verb talks to when given no ENDPOINT, and how `list` shows them:
real registry entries (of live processes: this one and its parent) in a real socket
directory, read from a working directory that one of them was started from."""

from __future__ import annotations

import datetime as _dt
import os
import re
import sys
import time

import pytest

from torchdoctor import registry
from torchdoctor.cli import processes
from torchdoctor.cli.errors import CliError
from torchdoctor.cli.main import main


def _entry(pid: int, cwd: str, script: list[str], **more: object) -> dict[str, object]:
    return {
        "pid": pid,
        "socket": str(registry.socket_path(pid)),
        "command": [sys.executable, "/somewhere/.venv/bin/torchdoctor", "run", *script],
        "script": script,
        "cwd": cwd,
        "run_dir": f"{cwd}/torchdoctor-runs/x",
        "started": time.time(),
        **more,
    }


@pytest.fixture
def two(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """This process registered as started in `here`, its parent in `there`."""
    monkeypatch.setenv("TORCHDOCTOR_SOCKET_DIR", str(tmp_path / "s"))
    here, there = tmp_path / "project", tmp_path / "other-checkout"
    here.mkdir()
    there.mkdir()
    registry.register(os.getpid(), _entry(os.getpid(), str(here), ["train.py", "--lr", "3e-4"]))
    long_args = ["-m", "pkg.train", "--config", "configs/" + "x" * 120 + ".yaml"]
    registry.register(os.getppid(), _entry(os.getppid(), str(there), long_args, rank=0, job="j"))
    return here, there


def test_no_endpoint_takes_the_only_process_started_here(two, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    here, there = two
    monkeypatch.chdir(here)
    assert processes.choose(processes.entries())["pid"] == os.getpid()
    # listed first, as `.`, with the script and its arguments, not the interpreter's path
    found = processes.entries()
    assert [e["pid"] for e in found] == [os.getpid(), os.getppid()]
    table = processes.table(found, None, "table").splitlines()
    assert table[0].split() == ["pid", "rank", "world_size", "node", "job", "started",
                                "directory", "command"]  # fmt: skip
    # the time of day for a process started today, the date too for one started before (a
    # suite that runs past midnight: this process is the test worker)
    began = processes.start_time(found[0])
    assert began is not None
    today = _dt.datetime.fromtimestamp(began).date() == _dt.date.today()
    when = r"\d\d:\d\d:\d\d" if today else r"[A-Z][a-z]{2} \d\d \d\d:\d\d"
    assert re.fullmatch(
        rf"{os.getpid()}\s+-\s+-\s+-\s+-\s+{when}\s+\.\s+train\.py --lr 3e-4", table[2]
    )
    # a long command is never cut: the script and every argument are there
    assert table[3].endswith(
        " ".join(["-m", "pkg.train", "--config", "configs/" + "x" * 120 + ".yaml"])
    )
    assert f" {there} " in table[3]  # another directory: where it is


def test_elsewhere_the_candidates_are_listed(two, monkeypatch, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(CliError) as caught:
        processes.choose(processes.entries())
    message = str(caught.value)
    assert message.startswith(
        "several probed processes and none started from this directory; name one by its pid"
    )
    assert str(os.getpid()) in message and "train.py --lr 3e-4" in message
    assert "pkg.train" in message and str(tmp_path / "other-checkout") in message
    # the same through a verb's command line: a usage error, exit 2
    assert main(["backtrace"]) == 2
    assert "none started from this directory" in capsys.readouterr().err
