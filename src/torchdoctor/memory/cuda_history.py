"""The CUDA caching allocator's history, kept bounded, and its snapshot written on OOM.

Once telemetry sees the run on CUDA, `start_history` turns on
`torch.cuda.memory._record_memory_history` with at most MAX_ENTRIES events (Python stacks
only, the cheap setting); TORCHDOCTOR_CUDA_HISTORY=0 turns it off and a number sets the bound.
On an out-of-memory error `dump_snapshot` writes `<run_dir>/cuda_memory_snapshot.pickle`: open
it at https://pytorch.org/memory_viz (drag the file onto the page) to see every segment, every
live block with the stack that allocated it, and the last MAX_ENTRIES allocations and frees.
Both do nothing without CUDA.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

MAX_ENTRIES = 100_000
SNAPSHOT_FILE = "cuda_memory_snapshot.pickle"
ENV = "TORCHDOCTOR_CUDA_HISTORY"

_state = {"recording": False}  # one history per process


def entries_from_env() -> int:
    text = os.environ.get(ENV, "").strip()
    if not text:
        return MAX_ENTRIES
    if text.isdigit():
        return int(text)
    return 0 if text.lower() in ("off", "false", "no") else MAX_ENTRIES


def _cuda(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


def start_history() -> bool:
    """Record the allocator's history (bounded); True when it is on."""
    torch = sys.modules.get("torch")
    if torch is None or not _cuda(torch) or _state["recording"]:
        return _state["recording"]
    entries = entries_from_env()
    if entries <= 0:
        return False
    try:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=entries
        )
    except TypeError:  # older signature
        torch.cuda.memory._record_memory_history(True, max_entries=entries)
    except Exception:
        return False
    _state["recording"] = True
    return True


def recording() -> bool:
    return _state["recording"]


def dump_snapshot(run_dir: Path | None, path: Path | None = None) -> Path | None:
    """Write the allocator snapshot (with the history when it was recorded) into the run
    directory, or to `path`; None without CUDA or when it cannot be written."""
    torch = sys.modules.get("torch")
    if torch is None or not _cuda(torch):
        return None
    if path is None:
        if run_dir is None:
            return None
        path = Path(run_dir) / SNAPSHOT_FILE
    try:
        torch.cuda.memory._dump_snapshot(str(path))
    except Exception:
        return None
    return path if path.exists() else None


def stop_history() -> None:
    torch = sys.modules.get("torch")
    if torch is None or not _state["recording"]:
        return
    _state["recording"] = False
    try:
        torch.cuda.memory._record_memory_history(enabled=None)
    except Exception:
        pass
