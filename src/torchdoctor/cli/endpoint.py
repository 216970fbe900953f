"""ENDPOINT (a pid, a socket path, or HOST:PORT) to an address, with its token.

With no ENDPOINT and exactly one probed process of this user on the machine, that one is used.
For a TCP endpoint the token comes from --token, then TORCHDOCTOR_TOKEN, then (for a process of
this user on this machine) the 0600 token file in its run directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchdoctor import registry
from torchdoctor.cli.client import Address
from torchdoctor.cli.errors import CliError
from torchdoctor.redact import command_line

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", ""}


def _describe(entry: dict[str, Any]) -> str:
    return f"  {entry['pid']}  {command_line(entry.get('command'))}"


def _live_entries() -> list[dict[str, Any]]:
    try:
        return registry.entries()
    except registry.InsecureDirectory as exc:
        raise CliError(str(exc)) from None


def resolve(endpoint: str | None, token: str | None = None) -> Address:
    token = token or os.environ.get("TORCHDOCTOR_TOKEN") or None
    if endpoint is None:
        entries = _live_entries()
        if not entries:
            raise CliError(
                "no probed process of yours is running here; start one with "
                "`torchdoctor run train.py` or `TORCHDOCTOR=1 python train.py`, "
                "or attach with `torchdoctor attach PID`"
            )
        if len(entries) > 1:
            listing = "\n".join(_describe(e) for e in entries)
            raise CliError(f"several probed processes; name one (pid):\n{listing}")
        return _from_entry(entries[0], str(entries[0]["pid"]))
    if endpoint.isdigit():
        entry = registry.find(int(endpoint))
        if entry is None:
            if not registry.alive(int(endpoint)):
                raise CliError(f"no process with pid {endpoint}")
            raise CliError(
                f"process {endpoint} is not probed by torchdoctor; start it with "
                f"`torchdoctor run` or TORCHDOCTOR=1, or run `torchdoctor attach {endpoint}`"
            )
        return _from_entry(entry, endpoint)
    if "/" in endpoint or endpoint.endswith(".sock"):
        if not Path(endpoint).exists():
            raise CliError(f"no socket at {endpoint}")
        return Address(label=endpoint, socket_path=endpoint)
    host, sep, port = endpoint.rpartition(":")
    if sep and port.isdigit():
        host = host.strip("[]")
        return Address(
            label=endpoint,
            host=host or "127.0.0.1",
            port=int(port),
            token=token or _local_token(host, int(port)),
        )
    raise CliError(f"not an ENDPOINT: {endpoint!r} (expected a pid, a socket path or HOST:PORT)")


def _from_entry(entry: dict[str, Any], label: str) -> Address:
    return Address(label=f"process {label}", socket_path=entry["socket"], pid=int(entry["pid"]))


def _local_token(host: str, port: int) -> str | None:
    if host not in _LOCAL_HOSTS and host != os.uname().nodename:
        return None
    try:
        entries = registry.entries(prune=False)
    except registry.InsecureDirectory:
        return None
    for entry in entries:
        tcp = entry.get("tcp") or ""
        if tcp.rpartition(":")[2] == str(port) and entry.get("token_file"):
            try:
                return Path(entry["token_file"]).read_text().strip()
            except OSError:
                return None
    return None
