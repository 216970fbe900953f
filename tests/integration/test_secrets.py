"""The TCP token stays out of every command line torchdoctor writes or shows, and run
directories are private (0700 directories, 0600 files)."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest
from helpers import free_port, script, td_run
from recording import td

TOKEN = "tok-Zq81xW4-never-shown"


def _unix_status(sock: str) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(sock)
        s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def _everything_under(path: Path) -> list[Path]:
    return [path, *sorted(path.rglob("*"))]


@pytest.mark.parametrize("form", ["separate", "equals", "env"])
def test_token_is_never_written_or_shown(launch, tmp_path, form) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    listen = ["--listen", f"127.0.0.1:{port}"]
    extra_env = {}
    if form == "separate":
        options = [*listen, "--token", TOKEN]
    elif form == "equals":
        options = [*listen, f"--token={TOKEN}"]
    else:  # the token from the environment, and the script handed the same value by mistake
        options = listen
        extra_env = {"TORCHDOCTOR_TOKEN": TOKEN}
    script_args = ["--pause", "0.01"] + (["--stop-file", f"stop-{TOKEN}"] if form == "env" else [])
    run = launch(td_run(*options, script("trainer.py"), *script_args), extra_env=extra_env)
    entry = run.wait_probe()
    run.wait_steps(2)
    shown = {
        "registry entry": json.dumps(entry),
        "list": run.cli("list").stdout,
        "list --format json": run.cli("list", "--format", "json").stdout,
        "status": _unix_status(entry["socket"]).decode(),
        "meta.json while running": (Path(entry["run_dir"]) / "meta.json").read_text(),
    }
    [listed] = json.loads(shown["list --format json"])
    assert "trainer.py" in listed["command"]
    assert ("--token ***" in listed["command"]) == (form == "separate")
    if form == "env":
        Path(run.cwd / f"stop-{TOKEN}").touch()
        assert run.wait() == 0, run.output()
    else:
        assert run.stop() == 0, run.output()
    run_dir = Path(entry["run_dir"])
    shown["meta.json"] = (run_dir / "meta.json").read_text()
    shown["summary"] = run.stderr()
    for where, text in shown.items():
        assert TOKEN not in text, where
    # The token is kept where it belongs: the 0600 token file.
    assert (run_dir / "token").read_text() == TOKEN
    meta = json.loads(shown["meta.json"])
    assert any("trainer.py" in part for part in meta["command"])


# The run directories' modes are judged on `torchdoctor run` through the CLI's main() in this
# process (tests/recording.py): the files are what they are, whichever process wrote them.


def test_run_directories_are_private(tmp_path) -> None:  # type: ignore[no-untyped-def]
    os.umask(0o022)  # the usual umask: without care, directories 0755 and files 0644
    port = free_port()
    run = td("run", "--listen", f"127.0.0.1:{port}", script("trainer.py"), "--steps", "30",
             cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr
    parent = tmp_path / "torchdoctor-runs"
    [run_dir] = sorted(parent.iterdir())
    assert stat.S_IMODE(parent.stat().st_mode) == 0o700
    paths = _everything_under(run_dir)
    assert {p.name for p in paths} >= {"meta.json", "token", "tables", "steps.seg"} or any(
        p.suffix == ".seg" for p in paths
    )
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


def test_an_explicit_run_dir_is_private_but_an_existing_one_keeps_its_mode(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    nested = tmp_path / "a" / "b"
    run = td("run", "--run-dir", str(nested), script("trainer.py"), "--steps", "3", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    for path in (tmp_path / "a", nested, nested / "tables"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    # `--run-dir .`: the user's own directory is not chmod-ed, but what torchdoctor writes is.
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    os.chmod(own, 0o755)
    run = td("run", "--run-dir", ".", script("trainer.py"), "--steps", "3", cwd=own)
    assert run.returncode == 0, run.stderr
    assert stat.S_IMODE(own.stat().st_mode) == 0o755
    assert stat.S_IMODE((own / "tables").stat().st_mode) == 0o700
    assert stat.S_IMODE((own / "meta.json").stat().st_mode) == 0o600
