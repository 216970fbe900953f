"""A probe in the benchmark's own process whose telemetry is installed and removed per block,
so "plain" and "instrumented" blocks alternate in one run."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import torchdoctor
from torchdoctor.telemetry.recorder import Recorder


def bench_probe(**options: Any) -> Any:
    os.environ.setdefault("TORCHDOCTOR_SOCKET_DIR", tempfile.mkdtemp(prefix="td-"))
    run_dir = tempfile.mkdtemp(prefix="td-bench-")
    probe = torchdoctor.start(run_dir=run_dir, quiet=True, **options)
    probe.telemetry.remove()  # blocks install their own
    probe.telemetry = None
    return probe


@contextlib.contextmanager
def recording(probe: Any, **config: Any) -> Iterator[None]:
    """Telemetry on for the block, with these options (trace_every, guard)."""
    if config:
        probe.config = probe.config.replace(**config)
    recorder = Recorder(probe)
    recorder.install()
    probe.telemetry = recorder
    try:
        yield
    finally:
        recorder.remove()
        probe.telemetry = None
