"""eval where the objects live: a name that is not a global of __main__ comes from the training
thread's frames (main(), train()), at a step boundary and from the probe's thread, and the
answer says which frame gave it. Real threads, a real SafePoint, a real __main__ module."""

from __future__ import annotations

import gc
import sys
import threading
import types
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for

from torchdoctor.frames import short_path
from torchdoctor.probe import activity, eval_at
from torchdoctor.probe.evaluator import evaluate
from torchdoctor.probe.routes import build_routes
from torchdoctor.telemetry.safe_point import SafePoint
from torchdoctor.telemetry.step_rows import StepHeadline


def _ended(at: float, duration: float) -> StepHeadline:
    return StepHeadline(step=0, time=at, duration=duration, data_wait=0.0, loss=None, allocated=0)


THIS = short_path(__file__)


class Held:
    """Something a frame holds (weakref-able, to see that eval lets frames go)."""


class Loop:
    """A script's main() -> train() running on its own thread, draining the safe point at each
    step end from inside its `step()` (as the optimizer's step hook does)."""

    def __init__(self) -> None:
        self.safe_point = SafePoint()
        self.last: StepHeadline | None = None
        self.train_thread: int | None = None
        self.running = True
        self.steps = 0
        self.pause = threading.Event()  # set: the loop waits outside any step (a stuck run)
        self.resume = threading.Event()
        self.held: weakref.ref[Held] | None = None
        self.thread = threading.Thread(target=self.main)

    def main(self) -> None:
        self.train_thread = threading.get_ident()
        optimizer = {"lr": 0.25}
        model = "the model in main()"
        lr = "main's lr"
        self.train(model, optimizer, lr)

    def train(self, model: str, optimizer: dict[str, float], lr: str) -> None:
        batch = Held()
        self.held = weakref.ref(batch)
        lr = "train's lr"  # noqa: F841 (read by eval through the frame)
        while self.running:
            self.step()
            if self.pause.is_set():
                self.resume.wait()

    def step(self) -> None:
        import time

        time.sleep(0.001)
        self.steps += 1
        self.last = _ended(time.time(), 0.001)
        if self.safe_point.pending:
            self.safe_point.drain(self.steps)


@pytest.fixture
def main_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("__main__")
    module.lr = "a global of __main__"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", module)
    return module


@pytest.fixture
def loop() -> Iterator[Loop]:
    loop = Loop()
    loop.thread.start()
    wait_for(lambda: loop.steps > 2)
    yield loop
    loop.running = False
    loop.resume.set()
    loop.thread.join()


class App:
    """The probe's view of the process, as far as the eval route needs it."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def training(self) -> Loop:
        return self.loop


def _at_step(loop: Loop, code: str, frame: str | None = None) -> Any:
    """The answer of the probe's eval route (POST /v1/eval), run at a step boundary."""
    eval_route = build_routes(App(loop)).table[("POST", "/v1/eval")]  # type: ignore[arg-type]
    request = {"code": code} if frame is None else {"code": code, "frame": frame}
    _status, answer = eval_route(request)
    assert answer["ran"]["where"] == "step", answer
    return types.SimpleNamespace(**answer)


def _line(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_names_of_main_and_train_come_from_their_frames(main_module, loop) -> None:
    result = _at_step(loop, "optimizer['lr'] * 2")
    assert (result.value, result.error) == ("0.5", None)
    # the innermost frame that has it: train() got it as an argument
    assert result.frames == [
        {"frame": f"train() at {THIS}:{_line('self.step()')}", "names": ["optimizer"]}
    ]
    # a global of __main__ comes first, as the name means in the script's own module
    assert _at_step(loop, "lr").value == "'a global of __main__'"
    # comprehensions, lambdas and functions of the code see the same names
    code = "def f():\n    return optimizer['lr']\n[f() + optimizer['lr'] for _ in range(2)]"
    assert _at_step(loop, code).value == "[0.5, 0.5]"


def test_frame_chooses_where_to_look_first(main_module, loop) -> None:
    result = _at_step(loop, "lr", frame="train")
    assert result.value == '"train\'s lr"'
    assert result.frames[0]["frame"].startswith("train() at ")
    assert _at_step(loop, "lr", frame="main").value == '"main\'s lr"'
    assert _at_step(loop, "lr", frame="2").value == '"main\'s lr"'  # 0 step(), 1 train()
    wrong = _at_step(loop, "lr", frame="fit")
    assert wrong.value is None and "no frame 'fit'" in wrong.error
    assert f"1 train() at {THIS}" in wrong.error and f"2 main() at {THIS}" in wrong.error


def test_assignments_go_to_main_never_to_a_frame(main_module, loop) -> None:
    _at_step(loop, "optimizer = 'rebound'\nseen = model")
    assert main_module.optimizer == "rebound"  # type: ignore[attr-defined]
    assert main_module.seen == "the model in main()"  # type: ignore[attr-defined]
    # the frame's own local is untouched: the loop still reads its dict
    assert _at_step(loop, "optimizer", frame="train").value == "{'lr': 0.25}"
    del main_module.optimizer  # type: ignore[attr-defined]
    assert _at_step(loop, "optimizer").value == "{'lr': 0.25}"


def test_a_name_found_nowhere_says_where_it_was_looked_for(main_module, loop) -> None:
    result = _at_step(loop, "schedulr")
    assert "NameError: name 'schedulr' is not defined" in result.error
    assert (
        f"(looked in: __main__'s globals; step() at {THIS}:{_line('drain(self.steps)')}; "
        f"train() at {THIS}:{_line('self.step()')}; "
        f"main() at {THIS}:{_line('self.train(model, optimizer, lr)')})"
    ) in result.error


def test_from_the_probe_thread_the_training_threads_frames(main_module, loop) -> None:
    loop.pause.set()  # stuck outside a step: no boundary comes
    stuck_at = f"in train() at {THIS}:{_line('self.resume.wait()')}"
    wait_for(lambda: activity.doing(loop.train_thread) == stuck_at, what="the loop to stall")
    result, placement = eval_at.run(
        lambda: evaluate("optimizer['lr']", thread_id=loop.train_thread), "now", loop
    )
    assert placement.where == "probe" and result.value == "0.25"
    assert result.frames()[0]["frame"] == stuck_at.removeprefix("in ")


def test_a_function_the_code_defines_keeps_no_frame_alive(main_module) -> None:
    loop = Loop()
    loop.thread.start()
    wait_for(lambda: loop.steps > 2)
    _at_step(loop, "def kept():\n    return optimizer")
    loop.running = False
    loop.thread.join()
    del loop.thread
    gc.collect()
    assert loop.held is not None and loop.held() is None  # train()'s frame is gone
    kept = main_module.kept  # type: ignore[attr-defined]
    with pytest.raises(NameError):
        kept()  # its names now come from __main__ alone


def test_an_import_in_progress_is_starting(tmp_path, monkeypatch) -> None:
    gate = threading.Event()
    started = threading.Event()
    name = f"td_slow_import_{id(gate)}"
    (tmp_path / f"{name}.py").write_text(
        f"import sys\nsys.modules[{__name__!r}].STARTED.set()\n"
        f"sys.modules[{__name__!r}].GATE.wait(30)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    globals()["GATE"], globals()["STARTED"] = gate, started
    thread = threading.Thread(target=lambda: __import__(name))
    thread.start()
    try:
        started.wait(30)
        assert activity.doing(
            thread.ident
        ) == f"importing {name}, from <lambda>() at {THIS}:" + str(
            _line("target=lambda: __import__(name)")
        )
    finally:
        gate.set()
        thread.join()
        sys.modules.pop(name, None)


def test_the_state_a_process_is_in() -> None:
    now = 1000.0
    assert activity.state(None, now) == activity.STARTING  # no step has ended yet
    assert activity.state(_ended(now - 5, 0.1), now) == activity.STEPPING
    assert activity.state(_ended(now - 11, 0.1), now) == activity.NOT_STEPPING
    # a slow step is not a stall: 3 usual step times
    assert activity.state(_ended(now - 60, 30.0), now) == activity.STEPPING
    assert activity.state(_ended(now - 91, 30.0), now) == activity.NOT_STEPPING
