"""A run that a signal ends says so in meta.json (terminated / interrupted / crashed, and the
signal), its tables are saved first, and the process ends as it would without torchdoctor:
the same exit status, the script's own handler called with its own exit code. (An uncaught
exception, for comparison: `failed`, under TORCHDOCTOR=1 too.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import script
from recording import query

from torchdoctor.store import rundir

# how -> (exit status as without torchdoctor, status, signal)
CASES = {
    "term": (-signal.SIGTERM, "terminated", "SIGTERM"),
    "hup": (-signal.SIGHUP, "terminated", "SIGHUP"),
    "int": (-signal.SIGINT, "interrupted", "SIGINT"),  # KeyboardInterrupt, then SIGINT again
    "handler": (7, "terminated", "SIGTERM"),
    "abrt": (-signal.SIGABRT, "crashed", "SIGABRT"),  # the reader's verdict, from fatal.log
    "raise": (1, "failed", None),  # no signal: an uncaught exception, for comparison
    "during_stop": (-signal.SIGTERM, "terminated", "SIGTERM"),  # it ends the process, not 1
}


def _signals_default() -> None:
    # A suite started under nohup passes SIGHUP on ignored: the script would (rightly) go on.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture(scope="module")
def ended(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """Every case at once (one process each, run side by side)."""
    base = tmp_path_factory.mktemp("endings")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    env.update(TORCHDOCTOR="1", TORCHDOCTOR_QUIET="1", OMP_NUM_THREADS="1")
    env["TORCHDOCTOR_SOCKET_DIR"] = str(base / "s")
    procs = {}
    for how in CASES:
        run_env = dict(env, TORCHDOCTOR_RUN_DIR=str(base / how))
        argv = [sys.executable, script("signal_end.py"), how]
        procs[how] = subprocess.Popen(
            argv, env=run_env, stdout=subprocess.PIPE, text=True, preexec_fn=_signals_default
        )
    out = {}
    for how, proc in procs.items():
        try:
            stdout, _ = proc.communicate(timeout=120)
        finally:
            proc.kill()
        out[how] = (proc.returncode, stdout, base / how)
    return out


@pytest.mark.parametrize("how", list(CASES))
def test_signal_ending_is_recorded(how: str, ended: dict[str, tuple[int, str, Path]]) -> None:
    code, stdout, run_dir = ended[how]
    expected_code, status, name = CASES[how]
    assert code == expected_code, stdout
    meta = rundir.read_meta(run_dir)
    assert (meta["status"], meta.get("signal")) == (status, name), meta
    if how == "abrt":  # no Python runs after it: rows of the last second may be lost
        assert meta["inferred"] is True
        assert "Aborted" in (run_dir / rundir.FATAL_FILE).read_text()
        return
    assert not (run_dir / rundir.FATAL_FILE).exists()
    # The steps reached disk before the process went (the spill thread's second never came).
    assert query(run_dir, "SELECT count(*) AS n FROM python.steps") == [{"n": 3}]
    if how == "handler":
        assert stdout == "handler is current: True\n"


def test_a_signal_the_main_thread_cannot_handle_still_ends_the_process(tmp_path: Path) -> None:
    """SIGTERM lands on another thread while the main thread sleeps in C: no Python handler
    runs until the sleep ends (30 s), whereas without torchdoctor the process ends at once.
    The signal watcher ends it after its grace second, with the ending saved."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    env.update(TORCHDOCTOR="1", TORCHDOCTOR_QUIET="1", TORCHDOCTOR_RUN_DIR=str(tmp_path / "r"))
    argv = [sys.executable, script("signal_end.py"), "other_thread"]
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert "sending SIGTERM" in proc.stdout.readline()
            assert proc.wait(timeout=15) == -signal.SIGTERM
        finally:
            proc.kill()
    meta = rundir.read_meta(tmp_path / "r")
    assert (meta["status"], meta["signal"], meta["steps"]) == ("terminated", "SIGTERM", 3)
    assert query(tmp_path / "r", "SELECT count(*) AS n FROM python.steps") == [{"n": 3}]


def test_an_ending_that_never_finishes_does_not_keep_the_process(tmp_path: Path) -> None:
    """Our handler is stuck writing the ending: the signal ends the process after the watcher's
    deadline, with the signal's status, and says why on stderr. (signal_end.py sets the
    deadline to 3 s: the 15 s of signal_watch.DEADLINE would be waited out here.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    env.update(TORCHDOCTOR="1", TORCHDOCTOR_QUIET="1", TORCHDOCTOR_RUN_DIR=str(tmp_path / "r"))
    argv = [sys.executable, script("signal_end.py"), "stuck_ending"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGTERM, out.stderr
    assert "torchdoctor: saving the ending took over 3 s" in out.stderr
