"""Shared fixtures: an isolated socket directory and environment per test, and `launch` for
training scripts in subprocesses (killed at the end of the test); `shared_launch`, the same
for one module (a live run that several tests question).

Scheduling under xdist (`-n 2`, `--dist loadgroup` from pyproject.toml): tests run longest
first, by the seconds recorded in tests/durations.json, so that no long test starts last and
makes the tail of the run; the tests of a module that share a module-scoped fixture, and those
marked with one xdist_group, go to one worker together, so that the shared job runs once.
(xdist 3.8's own loadgroup names a group by editing the node id, which pytest 9 no longer
allows; the workers write the groups to a file that the scheduler below reads.)
`pytest --record-durations tests/durations.json` rewrites the file from a full run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import Run, clean_env

# A test run started in the background of a shell without job control (`make test &` in a
# script, some CI runners) inherits SIGINT ignored, and so would every training script it
# starts: the tests of Ctrl-C would see scripts that cannot be interrupted. A handled signal
# is reset to its default across exec, so handling it here gives the children the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

DURATIONS = Path(__file__).with_name("durations.json")
# seconds assumed for a test missing from durations.json
DEFAULT_SECONDS = {"slow": 10.0, "integration": 3.0, "unit": 0.3}


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_addoption(parser: Any) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="write each test's seconds (set-up, call, tear-down) to PATH as JSON",
    )


def _base_id(nodeid: str) -> str:
    return nodeid.partition("@")[0]  # without xdist's "@group" suffix


def _shares_a_module_fixture(item: Any) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs[-1].scope in ("module", "package", "class")
        for name, defs in info.name2fixturedefs.items()
        if defs and name in item.fixturenames
    )


def _estimate(item: Any, recorded: dict[str, float]) -> float:
    if item.nodeid in recorded:
        return recorded[item.nodeid]
    if item.get_closest_marker("slow"):
        return DEFAULT_SECONDS["slow"]
    return DEFAULT_SECONDS["integration" if "/integration/" in item.nodeid else "unit"]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    if not _cuda():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)
    try:
        recorded = {k: float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError):
        recorded = {}
    # A group's weight is its tests' total: it runs on one worker, as one unit.
    groups: dict[str, str] = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name"))
        elif _shares_a_module_fixture(item):
            groups[item.nodeid] = item.module.__name__
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    _share_groups(config, groups)
    weight: dict[str, float] = {}
    for item in items:
        key = groups.get(item.nodeid, item.nodeid)
        weight[key] = weight.get(key, 0.0) + _estimate(item, recorded)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(
        key=lambda item: (
            -weight[groups.get(item.nodeid, item.nodeid)],
            groups.get(item.nodeid, ""),
            order[id(item)],
        )
    )


GROUPS_FILE = "TD_TEST_GROUPS"  # environment: where the workers leave {node id: group}


def pytest_configure(config: Any) -> None:
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        fd, path = tempfile.mkstemp(prefix="td-groups-", suffix=".json")
        os.close(fd)
        os.environ[GROUPS_FILE] = path  # the workers start after this and inherit it


def pytest_unconfigure(config: Any) -> None:
    if not hasattr(config, "workerinput") and GROUPS_FILE in os.environ:
        Path(os.environ.pop(GROUPS_FILE)).unlink(missing_ok=True)


def _share_groups(config: Any, groups: dict[str, str]) -> None:
    path = os.environ.get(GROUPS_FILE)
    if not path or not hasattr(config, "workerinput"):
        return
    # every worker collects the same tests and writes the same map; a rename is atomic
    part = f"{path}.{config.workerinput['workerid']}"
    Path(part).write_text(json.dumps(groups))
    os.replace(part, path)


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """Whole groups to one worker, every other test on its own, in collection order."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                try:
                    self.groups = json.loads(Path(os.environ[GROUPS_FILE]).read_text())
                except (KeyError, OSError, ValueError):
                    self.groups = {}
            return self.groups.get(_base_id(nodeid), nodeid)

    return GroupScheduling(config, log)


_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: Any) -> None:
    if report.when in ("setup", "call", "teardown"):
        key = _base_id(report.nodeid)
        _seconds[key] = _seconds.get(key, 0.0) + report.duration


def pytest_sessionfinish(session: Any) -> None:
    path = session.config.getoption("--record-durations", None)
    if not path or hasattr(session.config, "workerinput"):  # the controller writes it
        return
    # tests under a second are left to DEFAULT_SECONDS: their order hardly matters
    rounded = {k: round(v, 1) for k, v in sorted(_seconds.items()) if v >= 1.0}
    Path(path).write_text(json.dumps(rounded, indent=0) + "\n")


@pytest.fixture
def uncompiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has not compiled, for a test that records in-process: another test on
    this worker that compiled a model leaves Dynamo's count of compiled frames above 0, and a
    Session started after a compile runs as under torch.compile (no global module hooks, no
    NaN replay)."""
    dynamo_utils = sys.modules.get("torch._dynamo.utils")
    if dynamo_utils is not None:
        monkeypatch.setitem(dynamo_utils.counters["frames"], "total", 0)


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
    return clean_env(sockets)


def _launcher(env: dict[str, str], cwd: Path) -> Iterator[Callable[..., Run]]:
    runs: list[Run] = []

    def start(
        argv: list[str], extra_env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> Run:
        run_env = dict(env, **(extra_env or {}))
        where = cwd or default_cwd
        where.mkdir(parents=True, exist_ok=True)
        run = Run(argv, run_env, where)
        runs.append(run)
        return run

    default_cwd = cwd
    yield start
    for run in runs:
        run.kill()


@pytest.fixture
def launch(env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """launch(argv, extra_env=None, cwd=None) -> Run; every run is killed at the end."""
    yield from _launcher(env, tmp_path)


@pytest.fixture(scope="module")
def shared_launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Run]]:
    """`launch` for a module-scoped fixture: its own socket directory and environment; every
    run is killed once the module's tests are done."""
    sockets = Path(tempfile.mkdtemp(prefix="td-"))
    try:
        yield from _launcher(clean_env(sockets / "s"), tmp_path_factory.mktemp("shared"))
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_session_left_running() -> Iterator[None]:
    """A test that leaves a probe running in this process would hand it to the next test on
    the worker (torchdoctor.start returns the running one): stop it and fail the test that left
    it, not the one that meets it."""
    import sys

    yield
    session_module = sys.modules.get("torchdoctor.session")
    if session_module is None:
        return
    left = session_module.current()
    if left is not None:
        left.stop()
        pytest.fail(f"the test left a torchdoctor session running (run directory {left.run_dir})")
