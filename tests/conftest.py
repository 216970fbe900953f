"""Shared fixtures: an isolated socket directory and environment per test, and `launch` for
training scripts in subprocesses (killed at the end of the test)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Run


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def sockets() -> Iterator[Path]:
    # Short path: Unix socket paths are limited to about 100 bytes.
    path = Path(tempfile.mkdtemp(prefix="td-"))
    try:
        yield path / "s"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def env(sockets: Path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    out["TORCHDOCTOR_SOCKET_DIR"] = str(sockets)
    out["PYTHONUNBUFFERED"] = "1"
    out["OMP_NUM_THREADS"] = "1"  # two test workers share two cores
    return out


@pytest.fixture
def launch(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """launch(argv, extra_env=None, cwd=None) -> Run; every run is killed at the end."""
    runs: list[Run] = []

    def start(
        argv: list[str], extra_env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> Run:
        run_env = dict(env, **(extra_env or {}))
        where = cwd or tmp_path
        where.mkdir(parents=True, exist_ok=True)
        run = Run(argv, run_env, where)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.kill()
