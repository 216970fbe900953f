"""This user's probed processes as people tell them apart: the script and its arguments, the
directory it was started from, its rank and job, when it started and what it is doing. `list`
shows them, those started from the current directory first; a verb given no ENDPOINT takes the
only one, or else the only one started from here, and otherwise lists the candidates.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from pathlib import Path
from typing import Any

from torchdoctor import registry
from torchdoctor.cli.errors import CliError
from torchdoctor.redact import command_line
from torchdoctor.report.tabular import render

RANK_FIELDS = ("rank", "local_rank", "world_size", "node", "job")  # from the registry entry


def entries() -> list[dict[str, Any]]:
    """The live registry entries, those started from this directory first, then by start."""
    try:
        found = registry.entries()
    except registry.InsecureDirectory as exc:
        raise CliError(str(exc)) from None
    return sorted(found, key=lambda e: (not started_here(e), start_time(e) or 0, e["pid"]))


def started_here(entry: dict[str, Any]) -> bool:
    return entry.get("cwd") == os.getcwd()


def script_line(entry: dict[str, Any]) -> str:
    """`train.py --lr 3e-4`: the script and its arguments (the whole command line of an entry
    written by an older version)."""
    return command_line(entry.get("script") or entry.get("command"))


def directory(entry: dict[str, Any]) -> str:
    """Where it was started: `.` here, relative below here, `~/...` under home."""
    cwd = entry.get("cwd")
    if not cwd:
        return "?"
    here = os.getcwd()
    if cwd == here:
        return "."
    if cwd.startswith(here + os.sep):
        return os.path.relpath(cwd, here)
    home = os.path.expanduser("~")
    if home not in ("", "/") and (cwd == home or cwd.startswith(home + os.sep)):
        return "~" + cwd[len(home) :]
    return str(cwd)


def start_time(entry: dict[str, Any]) -> float | None:
    """When the process started: from /proc on Linux (a process attached to later started
    before its probe), else when its probe started."""
    try:
        fields = Path(f"/proc/{int(entry['pid'])}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration, KeyError):
        when = entry.get("started")
        return float(when) if isinstance(when, (int, float)) else None


def started(entry: dict[str, Any], now: float | None = None) -> str:
    """`14:03:12` today, `Nov 24 14:03` on another day."""
    when = start_time(entry)
    if when is None:
        return "?"
    moment = _dt.datetime.fromtimestamp(when)
    today = _dt.datetime.fromtimestamp(time.time() if now is None else now).date()
    return moment.strftime("%H:%M:%S" if moment.date() == today else "%b %d %H:%M")


def state(status: dict[str, Any] | None) -> str:
    """What /v1/status says the process is doing, as a few words."""
    if status is None:
        return "not answering"
    what = status.get("state")
    doing = status.get("doing") or ""
    step = status.get("last_step")
    if what == "starting":
        return f"starting ({doing})" if doing else "starting"
    counted = " since the attach" if status.get("attached") else ""
    if what == "not stepping":
        since = status.get("since_step")
        quiet = f"no step for {since:.0f} s" if isinstance(since, (int, float)) else "not stepping"
        return f"step {step}{counted}, {quiet}" + (f" ({doing})" if doing else "")
    return f"step {step}{counted}" if step is not None else "stepping"


def ask_status(entry: dict[str, Any]) -> dict[str, Any] | None:
    from torchdoctor.cli.client import Address, ProbeClient

    client = ProbeClient(Address(label=str(entry["pid"]), socket_path=entry["socket"]), timeout=2.0)
    try:
        _code, payload = client.request("GET", "/v1/status")
    except Exception:
        return None
    return payload


def record(entry: dict[str, Any], status: dict[str, Any] | None, asked: bool) -> dict[str, Any]:
    """One process as data (`list --format json`)."""
    return {
        "pid": entry["pid"],
        "state": state(status) if asked else None,
        "step": status.get("step") if status else None,
        "started": start_time(entry),
        "attached": entry.get("attached"),
        "cwd": entry.get("cwd"),
        "here": started_here(entry),
        "script": script_line(entry),
        **{field: entry.get(field) for field in RANK_FIELDS},
        "endpoint": entry.get("tcp") or entry["socket"],
        "socket": entry["socket"],
        "tcp": entry.get("tcp"),
        "run_dir": entry.get("run_dir"),
        "command": command_line(entry.get("command")),
    }


def table(
    found: list[dict[str, Any]], statuses: dict[int, dict[str, Any] | None] | None, fmt: str
) -> str:
    """The processes as `list` prints them: pid, (rank, world_size, node, job,) state,
    started, directory, command (never cut), and the TCP endpoint where one listens."""
    columns = ["pid", "state", "started", "directory", "command"]
    if statuses is None:
        columns.remove("state")
    if any(e.get("rank") is not None for e in found):
        columns[1:1] = ["rank", "world_size", "node", "job"]
    if any(e.get("tcp") for e in found):
        columns.append("tcp")
    rows = []
    for e in found:
        cells = {
            "pid": e["pid"],
            "state": state(statuses.get(e["pid"])) if statuses is not None else None,
            "started": started(e),
            "directory": directory(e),
            "command": script_line(e),
            "tcp": e.get("tcp") or "",
            **{field: "-" if e.get(field) is None else e[field] for field in RANK_FIELDS},
        }
        rows.append([cells[c] for c in columns])
    return render(columns, rows, fmt, whole=("command", "directory"))


def choose(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The process a verb given no ENDPOINT talks to: the only one, else the only one started
    from this directory; otherwise a usage error that lists the candidates."""
    if not found:
        raise CliError(
            "no probed process of yours is running here; start one with "
            "`torchdoctor run train.py` or `TORCHDOCTOR=1 python train.py`, "
            "or attach with `torchdoctor attach PID`"
        )
    if len(found) == 1:
        return found[0]
    here = [e for e in found if started_here(e)]
    if len(here) == 1:
        return here[0]
    which = "started from this directory" if here else "and none started from this directory"
    listing = table(here or found, None, "table")
    raise CliError(
        f"several probed processes {which}; name one by its pid "
        f"(torchdoctor PID VERB ...):\n{listing}"
    )
