"""Test helpers: real training scripts in real subprocesses, driven through the real CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"


# What torchdoctor says when something of its own went wrong: a hook switched off, a failed
# capture, an exception in its code. Never expected in a test's output.
_INTERNAL = re.compile(
    r"^torchdoctor: [^\n]*(failed|could not|cannot|switched off|is off|not recorded|"
    r"no Unix socket|no /metrics|no CUDA allocator|telemetry:)[^\n]*$"
    r"|File \"[^\"]*/torchdoctor/(?!demos/)[^\"]*\", line",
    re.M,
)


def internal_errors(text: str) -> list[str]:
    """torchdoctor's own failures in `text` (a script's stderr): every test that drops
    torchdoctor's lines from an output asserts first that this is empty."""
    return [m.group(0) for m in _INTERNAL.finditer(text)]


_TORCH_LOG = re.compile(r"^([DIWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ", re.M)


def strip_ours(stderr: str) -> str:
    """stderr without torchdoctor's lines: those starting with "torchdoctor" and the indented
    lines that continue them (the summary, alerts, explanations); torch's log lines without
    their time and pid. Fails first on any failure of torchdoctor's own among them."""
    assert not internal_errors(stderr), f"torchdoctor failed inside:\n{stderr}"
    kept: list[str] = []
    ours = False
    for line in _TORCH_LOG.sub(r"\1 ", stderr).splitlines(keepends=True):
        if line.startswith("torchdoctor"):
            ours = True
            if kept and kept[-1] == "\n":
                kept.pop()  # the blank line before the summary
            continue
        if ours and (line.startswith("  ") or line == "\n"):
            continue
        ours = False
        kept.append(line)
    return "".join(kept)


def clean_env(sockets: Path) -> dict[str, str]:
    """This environment without TORCHDOCTOR_* settings, probes' sockets under `sockets`."""
    import os

    out = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    out["TORCHDOCTOR_SOCKET_DIR"] = str(sockets)
    out["PYTHONUNBUFFERED"] = "1"
    out["OMP_NUM_THREADS"] = "1"  # two test workers share two cores
    return out


def free_port() -> int:
    """A TCP port nobody listens on right now (for --listen and torch.distributed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    condition: Callable[[], Any],
    timeout: float = 60.0,
    what: str = "condition",
    interval: float = 0.02,
) -> Any:
    """Poll an external condition (another process's state) until it holds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class Run:
    """A training script in a subprocess, and the CLI pointed at it."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self.cwd = cwd
        self.stdout_path = cwd / "stdout.txt"
        self.stderr_path = cwd / "stderr.txt"
        self._out = open(self.stdout_path, "w")  # noqa: SIM115
        self._err = open(self.stderr_path, "w")  # noqa: SIM115
        # Its own process group, so that kill() ends what it started too: a DataLoader worker
        # stuck in __getitem__ outlives a parent killed alone.
        self.proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=self._out, stderr=self._err, start_new_session=True
        )
        self.pid = self.proc.pid

    # -- the CLI -------------------------------------------------------------------------------
    def cli(
        self, *args: str, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return cli(*args, env=self.env, cwd=self.cwd, input=input, timeout=timeout)

    def query(self, sql: str) -> list[dict[str, Any]]:
        out = self.cli(str(self.pid), "query", sql, "--format", "json")
        assert out.returncode == 0, out.stderr
        return list(json.loads(out.stdout))

    # -- waiting on the process ------------------------------------------------------------------
    def entry(self) -> dict[str, Any] | None:
        path = Path(self.env["TORCHDOCTOR_SOCKET_DIR"]) / f"{self.pid}.json"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None

    def wait_probe(self, timeout: float = 60) -> dict[str, Any]:
        def up() -> Any:
            if self.proc.poll() is not None:
                raise AssertionError(f"the script exited early:\n{self.output()}")
            return self.entry()

        return dict(wait_for(up, timeout, "the probe to come up"))

    def ask(self, sql: str) -> list[dict[str, Any]]:
        """The rows of a query, asked over the probe's Unix socket from this process: for
        polling, where the CLI would start a Python per poll on cores the training needs (the
        CLI's `query` has tests of its own)."""
        from torchdoctor.cli.client import Address, ProbeClient

        entry = self.entry()
        if not entry or not entry.get("socket"):
            return self.query(sql)
        client = ProbeClient(Address(f"pid {self.pid}", socket_path=entry["socket"]))
        status, payload = client.request("POST", "/v1/query", {"sql": sql})
        assert status == 200, payload
        return [dict(zip(payload["columns"], row, strict=True)) for row in payload["rows"]]

    def steps(self) -> int:
        return int(self.ask("SELECT count(*) AS n FROM python.steps")[0]["n"])

    def wait_steps(self, n: int, timeout: float = 60) -> int:
        def reached() -> int:
            now = self.steps()
            return now if now >= n else 0

        # a query costs the training process a little: a few a second, not fifty
        return int(wait_for(reached, timeout, f"{n} steps", interval=0.1))

    def stop_file(self) -> Path:
        return self.cwd / "stop"

    def stop(self, timeout: float = 60) -> int:
        self.stop_file().touch()
        return self.wait(timeout)

    def wait(self, timeout: float = 60) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            self._out.close()
            self._err.close()
        return code

    def stdout(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.stdout_path.read_text()

    def stderr(self) -> str:
        if not self._err.closed:
            self._err.flush()
        return self.stderr_path.read_text()

    def output(self) -> str:
        return f"--- stdout\n{self.stdout()}\n--- stderr\n{self.stderr()}"

    def run_dirs(self) -> list[Path]:
        return sorted((self.cwd / "torchdoctor-runs").glob("*"))

    def kill(self) -> None:
        """The script and every process of its group (workers, ranks), even once it exited."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # nothing of the group is left
        if self.proc.poll() is None:
            self.proc.wait(10)


def cli(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    input: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchdoctor", *args],
        env=env,
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli_in_process(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`torchdoctor ARGS` through the CLI's main() in this process, with `env` as its whole
    environment and `cwd` as its working directory, as the console script would run there: for
    the polls of a test, where a Python started per poll (about 0.3 CPU-s each, several a
    second) takes the cores the job under test needs. Lighter than recording.td: a verb that
    only reads a run or asks an endpoint changes nothing else in the process. What a test
    asserts of the CLI itself it asks of a real `torchdoctor` process (`cli`)."""
    import contextlib
    import io

    from torchdoctor.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    argv = [sys.executable, "-m", "torchdoctor", *args]
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def td_run(*args: str) -> list[str]:
    """argv for `torchdoctor run ...` in a subprocess."""
    return [sys.executable, "-m", "torchdoctor", "run", *args]


def script(name: str) -> str:
    return str(SCRIPTS / name)


def line_of(name: str, text: str, after: str = "") -> int:
    """Number of the first line of test script `name` that contains `text` (at or after the
    first line containing `after`): tests name lines by their text, so editing a script does
    not shift them."""
    lines = Path(script(name)).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if after in line), len(lines))
    for number, line in enumerate(lines[start:], start + 1):
        if text in line:
            return number
    raise AssertionError(f"no line of {name} holds {text!r} (after {after!r})")


def site_of(name: str, text: str) -> str:
    """'path:line' of that line, as the tables write a call site."""
    return f"{script(name)}:{line_of(name, text)}"


def series_inputs(
    loss: Any,
    grad_norm: Any = None,
    lr: Any = None,
    steps: Any = None,
    columns: dict[str, Any] | None = None,
) -> Any:
    """A diagnosis module's Inputs over a python.steps table holding these series (None, NaN
    or a missing series: NULL), and any other column of it given in `columns` (a step's
    `duration` is 0.1 s unless given), for unit tests of the thresholds in milliseconds."""
    import numpy as np

    from torchdoctor.config import Config
    from torchdoctor.diagnose.inputs import Inputs
    from torchdoctor.store.columns import DTYPES, Block
    from torchdoctor.store.schema import MODULE_GRADS, STEPS

    n = len(loss)
    data = {c.name: np.zeros(n, dtype=DTYPES[c.type]) for c in STEPS.columns}
    data["step"] = np.arange(n) if steps is None else np.asarray(steps, dtype=np.int64)
    data["time"] = 1000.0 + np.arange(n, dtype=float)
    data["duration"] = np.full(n, 0.1)
    nulls = {}
    for name, values in (("loss", loss), ("grad_norm", grad_norm), ("lr", lr)):
        if values is None:
            nulls[name] = np.ones(n, dtype=bool)
            continue
        column = np.array([np.nan if v is None else v for v in values], dtype=float)
        data[name] = column
        nulls[name] = np.array([v is None for v in values], dtype=bool)
    for name, values in (columns or {}).items():
        data[name] = np.asarray(values, dtype=data[name].dtype)
    steps_block = Block(STEPS, data, nulls, n)
    return Inputs(steps_block, Block.empty(MODULE_GRADS), [], Config(), 2000.0)
