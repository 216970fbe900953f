"""The promise of `torchdoctor.Session` as a scoped object: sessions one after another in one
process each record their own run completely, and once a session is over everything it
installed is gone (patches, global hooks, signal handlers, the excepthook, os._exit, the
import watch, the compile watch's loggers, the collectives kernel, its threads, its files and
sockets, its atexit handlers), so that the process is as it was before it."""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo  # the compile watch installs once Dynamo is imported
from helpers import wait_for
from recording import query
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.optim import optimizer as optimizer_hooks
from torch.utils.data import DataLoader, TensorDataset, dataloader

import torchdoctor
from torchdoctor import registry, session
from torchdoctor.telemetry import collectives, compile_events

_SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
_COMPILE_LOGGERS = ("torch._utils_internal", *compile_events._GRAPH_BREAK_LOGGERS)


def _logger(name: str) -> tuple[Any, ...]:
    logger = logging.getLogger(name)
    return (logger.level, tuple(logger.handlers), tuple(logger.filters), logger.propagate)


def _wakeup_fd() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def _fds() -> set[str]:
    """This process's open files, by what they are (a descriptor number may be reused)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass  # the directory's own descriptor, closed since
    return out


def installed() -> dict[str, Any]:
    """What a session may install or change in the process, as it is now."""
    from torch.distributed import distributed_c10d

    scaler = torch.amp.GradScaler
    return {
        "torch.autograd.backward": torch.autograd.backward,
        "clip_grad_norm_": torch.nn.utils.clip_grad_norm_,
        "torch.compile": torch.compile,
        "torch.jit.script": torch.jit.script,
        "Module.__getstate__": nn.Module.__dict__.get("__getstate__"),
        "DataLoader.__iter__": DataLoader.__dict__["__iter__"],
        "DataLoader iterator __next__": dataloader._BaseDataLoaderIter.__dict__["__next__"],
        "GradScaler": (scaler.__dict__["scale"], scaler.__dict__["step"]),
        "init_process_group": (
            torch.distributed.init_process_group,
            distributed_c10d.init_process_group,
        ),
        "optimizer global hooks": (
            list(optimizer_hooks._global_optimizer_pre_hooks),
            list(optimizer_hooks._global_optimizer_post_hooks),
        ),
        "module global hooks": {
            name: list(getattr(module_hooks, name))
            for name in dir(module_hooks)
            if name.startswith("_global_") and name.endswith("hooks")
        },
        "signal functions": (signal.signal, signal.getsignal, signal.set_wakeup_fd),
        "signal handlers": {s: signal.getsignal(s) for s in _SIGNALS},
        "wakeup fd": _wakeup_fd(),
        "os._exit": os._exit,
        "sys.excepthook": sys.excepthook,
        "threading.excepthook": threading.excepthook,
        "trace and profile": (sys.gettrace(), sys.getprofile()),
        "sys.meta_path": list(sys.meta_path),
        "faulthandler": faulthandler.is_enabled(),
        "compile watch loggers": {name: _logger(name) for name in _COMPILE_LOGGERS},
        "collectives kernel": (list(collectives._current), list(collectives._library)),
        "threads": set(threading.enumerate()),
        "open files": _fds(),
        "current session": session.current(),
        "registry entry": registry.find(os.getpid()),
    }


def _train(steps: int, width: int) -> None:
    """A real loop (a DataLoader, an optimizer, clip_grad_norm_), then a compiled function."""
    torch.manual_seed(width)
    model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(8 * steps, 4), torch.randn(8 * steps, 2))
    for x, y in DataLoader(data, batch_size=8):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    with torch.no_grad():
        torch.compile(_distance, backend="eager")(model(x), y)


def _distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).pow(2).mean()


def _fresh_dynamo() -> None:
    """Dynamo's caches and counters as in a new process: each run compiles its own graph, and
    its steps are traced (module hooks stay off in a process that has compiled before)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


@pytest.fixture
def sockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    directory = tempfile.mkdtemp(prefix="td-")
    monkeypatch.setenv("TORCHDOCTOR_SOCKET_DIR", directory + "/s")
    yield


def _differences(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: (before[k], after[k]) for k in before if before[k] != after[k]}


def _settled(before: dict[str, Any]) -> dict[str, Any]:
    """The differences left once the session's threads have ended (stop() ends them; a
    thread's last instructions may still be running when it returns)."""

    def same() -> bool:
        return not (set(threading.enumerate()) - before["threads"])

    wait_for(same, timeout=5, what="the session's threads to end")
    return _differences(before, installed())


def test_two_sessions_one_after_another_record_their_own_runs_and_leave_nothing(
    tmp_path: Path, sockets: None
) -> None:
    _train(1, 4)  # whatever torch and Dynamo set up once per process, set up already
    _fresh_dynamo()
    with torchdoctor.Session(tmp_path / "warm", quiet=True) as warm:
        _train(1, 4)
    assert warm.summary().steps == 1
    before = installed()
    stopped: list[weakref.ref[torchdoctor.Session]] = []
    for name, steps, width in (("a", 5, 16), ("b", 7, 32)):
        run_dir = tmp_path / name
        _fresh_dynamo()
        with torchdoctor.Session(run_dir, quiet=True, trace_every=1) as s:
            during = installed()
            assert during["current session"] is s and during["registry entry"] is not None
            _train(steps, width)
            live = s.sql.execute("SELECT count(*) FROM python.steps")  # as the endpoint asks
            assert live.rows == [(steps,)]
        assert _settled(before) == {}, f"session {name} left these behind"
        # Its own run, complete: every step, its model, its compilation, its ending.
        assert [r["step"] for r in query(run_dir, "SELECT step FROM python.steps")] == list(
            range(steps)
        )
        params = query(run_dir, "SELECT sum(params) AS n FROM python.modules")[0]["n"]
        assert params == 4 * width + width + width * 2 + 2
        traced = query(run_dir, "SELECT DISTINCT step FROM python.torch_trace ORDER BY step")
        assert [r["step"] for r in traced] == list(range(1, steps))  # step 0 finds the models
        compiled = query(run_dir, "SELECT kind, function FROM python.compile")
        assert ("compile", "_distance") in {(r["kind"], r["function"]) for r in compiled}
        meta = (run_dir / "meta.json").read_text()
        assert '"status": "finished"' in meta and f'"steps": {steps}' in meta
        stopped.append(weakref.ref(s))
        del s
    # Nothing keeps a session once it is over (an atexit handler, a hook, a thread, a
    # registry), but for the C++ collectives kernel, which holds the last one's recorder
    # until the next session configures it: session a is gone once b has run.
    gc.collect()
    assert stopped[0]() is None
    # Training after the sessions is recorded nowhere.
    _train(2, 8)
    assert len(query(tmp_path / "b", "SELECT step FROM python.steps")) == 7


def test_sessions_in_one_second_get_their_own_default_run_directories(
    tmp_path: Path, sockets: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    dirs = []
    for steps in (2, 3, 4):  # a session takes milliseconds: these begin in one second or two
        with torchdoctor.Session(quiet=True) as s:
            _train(steps, 4)
        dirs.append(s.run_dir)
    assert len(set(dirs)) == 3
    assert all(d.parent == tmp_path / "torchdoctor-runs" for d in dirs)
    for d, steps in zip(dirs, (2, 3, 4), strict=True):
        assert len(query(d, "SELECT step FROM python.steps")) == steps
