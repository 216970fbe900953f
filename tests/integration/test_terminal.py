"""The live status line on a real pseudo-terminal: never glued to the script's own output,
and no trace of it where the output is not a terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys

from helpers import script, td_run

STATUS = "torchdoctor | "
CHATTY = [script("chatty.py"), "40", "0.05"]
QUICK = [script("chatty.py"), "20", "0.005"]


def _read_all(master: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> bytes:
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            raise AssertionError(f"no output for {timeout} s:\n{seen[-2000:]!r}")
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    return seen


def screen(raw: bytes) -> list[str]:
    """The lines a terminal ends up showing: carriage returns, erase-to-end-of-line and
    overwriting applied."""
    lines: list[str] = [""]
    col = 0
    text = raw.decode(errors="replace")
    i = 0
    while i < len(text):
        if text.startswith("\x1b[K", i):
            lines[-1] = lines[-1][:col]
            i += 3
            continue
        ch = text[i]
        i += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append("")
            col = 0
        else:
            line = lines[-1]
            lines[-1] = line[:col].ljust(col) + ch + line[col + 1 :]
            col += 1
    return lines


def _on_a_terminal(argv: list[str], env: dict[str, str], cwd: object) -> tuple[int, bytes]:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave
    )
    os.close(slave)
    try:
        raw = _read_all(master, proc)
    finally:
        os.close(master)
    return proc.wait(60), raw


def test_script_output_never_shares_a_line_with_the_status(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, raw = _on_a_terminal(td_run(*CHATTY), env, tmp_path)
    assert code == 0, raw[-3000:]
    drawn = raw.count(STATUS.encode())
    assert drawn >= 5, raw[-3000:]  # the line was really there, many times, between prints
    lines = screen(raw)
    glued = [line for line in lines if STATUS in line and re.search(r"-line|partial|script", line)]
    assert not glued, glued[:5]
    mine = [line for line in lines if re.search(r"(out|err)-line|partial-|script finished", line)]
    expected = [rf"out-line {i} loss \d\.\d{{6}}" for i in range(40)]
    expected += [f"err-line {i}" for i in range(0, 40, 3)]
    expected += [rf"partial-{i} \[done\]" for i in range(1, 40, 4)] + ["script finished"]
    for pattern in expected:  # each of the script's lines, whole, on a line of its own
        assert sum(bool(re.fullmatch(pattern, line)) for line in mine) == 1, pattern
    assert len(mine) == len(expected)
    assert "torchdoctor summary" in raw.decode(errors="replace")


def _probed_with_stderr_on_a_terminal(tmp_path, env, argv: list[str]):  # type: ignore[no-untyped-def]
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    out = proc.stdout.read()  # type: ignore[union-attr]
    proc.wait(120)
    os.close(master)
    return proc.returncode, out


def test_pipes_get_the_same_bytes_as_without_torchdoctor(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}  # the usual buffering

    def piped(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, timeout=120)

    plain, probed = piped([sys.executable, *QUICK]), piped(td_run("--quiet", *QUICK))
    assert plain.returncode == probed.returncode == 0
    assert probed.stdout == plain.stdout and b"out-line 19" in plain.stdout
    assert probed.stderr == plain.stderr and b"err-line 18" in plain.stderr
    # stdout a pipe, stderr a terminal with the status line on it: stdout is still untouched.
    # (chatty.py's stdout does not depend on where its stderr goes: the plain run above is
    # the reference.)
    code, out = _probed_with_stderr_on_a_terminal(tmp_path, env, td_run(*QUICK))
    assert code == 0
    assert out == plain.stdout
