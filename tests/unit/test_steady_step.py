"""The steady step's compiled handlers (telemetry/steady.py, native/steady.cpp) record what the
general path records: each loop here runs twice in this process, once as it runs under
torchdoctor and once with every step on the general path, and the rows must be the same
(times and memory aside)."""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchdoctor

pytestmark = pytest.mark.usefixtures("uncompiled")  # global hooks on the first step, as in a script
STEPS = 14
# the columns that do not depend on timing: what each step is and what it read
STEP_COLUMNS = ("step", "loss", "grad_norm", "lr", "micro_batches", "skipped", "traced")
UPDATE_COLUMNS = ("step", "optimizer", "is_primary", "loss", "grad_norm", "lr", "skipped")


def _model(width: int = 8) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))


def _data(step: int) -> torch.Tensor:
    return torch.randn(6, 4, generator=torch.Generator().manual_seed(step))


def plain_sgd() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    for step in range(STEPS):
        loss = model(_data(step)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def clipped_adam() -> None:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(STEPS):
        loss = model(_data(step)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()


def accumulated() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        for micro in range(2):
            (model(_data(step * 2 + micro)).pow(2).mean() / 2).backward()
        opt.step()
        opt.zero_grad()


def goes_nan() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        scale = float("nan") if step == 9 else 1.0
        loss = model(_data(step) * scale).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def two_optimizers() -> None:
    gen, disc = _model(), _model(6)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.05)
    for step in range(STEPS):
        loss_d = disc(_data(step)).pow(2).mean()
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        if step >= 4:  # the second optimizer joins a run that was steady
            loss_g = gen(_data(step + 100)).pow(2).mean()
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()


def lbfgs() -> None:
    model = _model()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
    for step in range(STEPS):
        x = _data(step)

        def closure(x: torch.Tensor = x) -> torch.Tensor:
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss

        opt.step(closure)


def wide() -> None:
    # more gradient elements than the C++ sum reads in one pass: the general norm every step
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 600), nn.ReLU(), nn.Linear(600, 500))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        loss = model(_data(step)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


LOOPS: dict[str, Callable[[], None]] = {
    f.__name__: f
    for f in (plain_sgd, clipped_adam, accumulated, goes_nan, two_optimizers, lbfgs, wide)
}


def _record(run_dir: Path, loop: Callable[[], None], steady: bool) -> dict[str, Any]:
    with torchdoctor.Session(run_dir, quiet=True, trace_every=5) as session:
        recorder = session.ensure_telemetry()
        assert recorder is not None
        recorder.allow_steady = steady
        taken: list[bool] = []
        recorder.step_listeners.append(lambda _state, _step: taken.append(recorder.steady))
        loop()
        handlers = recorder.steady_handlers
        steps = recorder.tables["steps"].snapshot()
        updates = recorder.tables["optimizer_steps"].snapshot()
        events = recorder.tables["events"].snapshot()
    return {
        "steps": _rows(steps, STEP_COLUMNS),
        "updates": _rows(updates, UPDATE_COLUMNS),
        "events": sorted(str(k) for k in events.data["kind"]),
        "steady_steps": sum(1 for s in taken if s is not None),
        "ended_in_cpp": handlers.steps if handlers is not None else 0,
    }


def _rows(block: Any, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    out = []
    for i in range(block.rows):
        row = []
        for name in columns:
            if block.nulls.get(name) is not None and block.nulls[name][i]:
                row.append(None)
            else:
                value = block.data[name][i]
                value = value.item() if hasattr(value, "item") else value
                row.append("nan" if isinstance(value, float) and math.isnan(value) else value)
        out.append(tuple(row))
    return out


@pytest.mark.parametrize("name", sorted(LOOPS))
def test_the_steady_path_records_what_the_general_path_records(tmp_path: Path, name: str) -> None:
    general = _record(tmp_path / "general", LOOPS[name], steady=False)
    steady = _record(tmp_path / "steady", LOOPS[name], steady=True)
    assert general["steady_steps"] == general["ended_in_cpp"] == 0
    assert steady["steps"] == general["steps"]
    assert steady["updates"] == general["updates"]
    assert steady["events"] == general["events"]
    assert len(steady["steps"]) >= 6


def test_a_settled_loop_takes_the_steady_path_and_a_traced_step_does_not(tmp_path: Path) -> None:
    seen = _record(tmp_path / "run", plain_sgd, steady=True)
    traced = sum(1 for row in seen["steps"] if row[-1])
    # every step after the first, but those traced and the silent checks' sampled ones
    assert 0 < seen["steady_steps"] < STEPS - traced
    # the compiled handlers ended the steady steps (those a rank poll was not due at)
    assert 0 < seen["ended_in_cpp"] <= seen["steady_steps"]
    seen = _record(tmp_path / "two", two_optimizers, steady=True)
    assert seen["steady_steps"] <= 4  # not once a second optimizer steps


def test_the_loss_line_follows_the_line_that_called_backward() -> None:
    from torchdoctor.telemetry.model_roots import ModelRoots
    from torchdoctor.telemetry.models import Models

    roots = ModelRoots(Models(), {}, lambda kind, data: None)

    def site() -> tuple[str, int] | None:
        return roots.loss_site(sys._getframe(1))  # as on_backward asks: from the caller

    here = sys._getframe().f_lineno
    first = site()
    second = site()
    again = [site() for _ in range(2)]  # one line twice (from the comprehension's frame)
    assert first == (__file__, here + 1) and second == (__file__, here + 2)
    assert again == [(__file__, here + 3)] * 2


def test_code_walked_before_from_a_deeper_stack_is_walked_again() -> None:
    # The cached walk says the caller was `up` frames above this code; called now from a
    # stack with fewer frames than that, the walk is taken afresh (it once ran off the top).
    from torchdoctor.telemetry.model_roots import ModelRoots
    from torchdoctor.telemetry.models import Models

    roots = ModelRoots(Models(), {}, lambda kind, data: None)

    def backward_here() -> tuple[str, int] | None:
        return roots.loss_site(sys._getframe())

    code = backward_here.__code__
    roots.last_walk = (code, 10_000, code, True, -1, None)
    assert backward_here() == (__file__, code.co_firstlineno + 1)


def test_what_the_compiled_handlers_use_is_on_a_real_recorder(tmp_path: Path) -> None:
    # steady.cpp reads and writes the Recorder's parts by name: each name must be there
    with torchdoctor.Session(tmp_path, quiet=True) as session:
        recorder = session.ensure_telemetry()
        assert recorder is not None
        handlers = recorder.steady_handlers
        assert handlers is not None, "the compiled module is built for the tests (make test)"
        missing = []
        for owner, attribute in handlers.names:
            obj: Any = recorder
            for part in owner.split(".")[1:]:
                obj = getattr(obj, part)
            if not hasattr(obj, attribute):
                missing.append(f"{owner}.{attribute}")
        assert missing == []
        assert len(handlers.names) > 30


@contextlib.contextmanager
def _steady_session(tmp_path: Path) -> Iterator[tuple[Any, nn.Module, torch.optim.Optimizer]]:
    """A session recording in this process, its compiled handlers built, and a model to train."""
    with torchdoctor.Session(tmp_path, quiet=True, trace_every=0) as session:
        recorder = session.ensure_telemetry()
        assert recorder is not None and recorder.steady_handlers is not None
        model = _model()
        yield recorder, model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_failure_in_a_compiled_handler_switches_the_telemetry_off_not_the_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("torchdoctor._failsafe._said", set())  # said once: here, not for good
    with _steady_session(tmp_path) as (recorder, model, opt):
        losses = []
        for step in range(12):
            if step == 8:  # the steady step's state broken under it
                recorder.state.losses = None
            loss = model(_data(step)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert recorder.steady_handlers.steps > 0
        assert not recorder.switch.on  # turned off, and said so once
        assert len(losses) == 12  # the training went on
    said = capsys.readouterr().err
    assert "telemetry failed (TypeError: StepState.losses is not a list)" in said


def test_the_next_step_state_made_in_cpp_is_the_one_python_makes(tmp_path: Path) -> None:
    # steady.cpp makes the next StepState without calling its __init__: the same attributes
    from torchdoctor.telemetry.step import StepState

    with _steady_session(tmp_path) as (recorder, model, opt):
        for step in range(8):
            loss = model(_data(step)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            ended = recorder.steady_handlers.steps
            opt.step()
        assert recorder.steady_handlers.steps == ended + 1  # the last step ended in C++
        made = vars(recorder.state)
        expected = vars(StepState(made["start"]))
    assert made == expected
    assert {k: type(v) for k, v in made.items()} == {k: type(v) for k, v in expected.items()}
    assert list(made["phases"]) == list(expected["phases"])


def test_a_step_grad_scaler_skips_is_a_skipped_step_through_either_hook(tmp_path: Path) -> None:
    # the count of optimizer.step() calls GradScaler.step compares is kept by the hook torch
    # calls: the compiled one until the swap to the Python twins (torch.compile's), then theirs
    with _steady_session(tmp_path) as (recorder, model, opt):
        scaler = torch.amp.GradScaler("cpu")
        for step in range(10):
            if step == 6:
                recorder.use_python_hooks()
            loss = model(_data(step)).pow(2).mean()
            if step in (4, 8):
                loss = loss * math.inf  # inf gradients: the scaler skips this update
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        calls = recorder.steady_handlers.optimizer_calls
        rows = _rows(recorder.tables["steps"].snapshot(), ("step", "skipped"))
    assert calls == 5  # steps 0-5 but the skipped 4
    assert [step for step, skipped in rows if skipped] == [4, 8]
    assert len(rows) == 10
