"""ENDPOINT (a pid, a socket path, or HOST:PORT) to an address, with its token.

With no ENDPOINT: the only probed process of this user on the machine, or else the only one
started from the current directory (cli/processes.py).
For a TCP endpoint the token comes from --token, then TORCHDOCTOR_TOKEN, then (for a process of
this user on this machine) the 0600 token file in its run directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchdoctor import registry
from torchdoctor.cli import processes
from torchdoctor.cli.client import Address
from torchdoctor.cli.errors import CliError

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", ""}


def resolve(endpoint: str | None, token: str | None = None) -> Address:
    token = token or os.environ.get("TORCHDOCTOR_TOKEN") or None
    if endpoint is None:
        chosen = processes.choose(processes.entries())
        return _from_entry(chosen, str(chosen["pid"]))
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
