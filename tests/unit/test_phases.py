"""The phase timer (forward is the models' top-level calls; the gaps between phases, and an
input function's share of them booked as data_wait) and the judgement of gap samples (which
function of the loop the time outside every phase goes to, and whether it is input)."""

from __future__ import annotations

from typing import Any

import pytest

from torchdoctor import native
from torchdoctor.telemetry.gap_sampler import Sample, judge
from torchdoctor.telemetry.phases import PhaseTimer, new_timer, zero


def _compiled() -> PhaseTimer:
    kernels = native.load()
    assert kernels is not None, "make test builds it: python -m torchdoctor.native"
    return new_timer()


# every test of the timer runs on both: this module's class and the compiled one (phases.cpp)
TIMERS = pytest.mark.parametrize("make", [PhaseTimer, _compiled], ids=["python", "native"])


@TIMERS
def test_forward_is_the_models_calls_and_the_rest_is_a_gap(make: Any) -> None:
    timer, totals = make(), zero()
    assert timer.begin_forward(1.0, totals)
    assert not timer.begin_forward(1.5, totals)  # a model called inside the model
    timer.end_forward(2.0, totals)  # ... returns: the outer call goes on
    assert timer.phase == "forward"
    timer.end_forward(3.0, totals)
    assert timer.gap == "forward"  # the gap after the model's return (a loss, get_batch)
    timer.enter("backward", 5.0, totals)
    timer.exit("backward", 6.0, totals)
    assert totals == {
        "data_wait": 0.0,
        "forward": 2.0,
        "evaluation": 0.0,
        "backward": 1.0,
        "optimizer": 0.0,
    }
    assert timer.gap == "backward"


@TIMERS
def test_an_input_functions_share_of_its_gap_is_data(make: Any) -> None:
    timer, totals = make(), zero()
    timer.input_shares = {"forward": 0.9, "start": 1.0}
    timer.step_ended(0.0, totals)  # a step begins: its opening gap
    timer.begin_forward(2.0, totals)  # 2 s of the opening gap
    timer.end_forward(3.0, totals)
    timer.enter("backward", 13.0, totals)  # 10 s after the model returned
    timer.exit("backward", 14.0, totals)
    timer.enter("optimizer", 15.0, totals)  # the gap after backward is not input
    timer.exit("optimizer", 16.0, totals)
    timer.step_ended(16.0, totals)
    assert totals["data_wait"] == pytest.approx(2.0 + 9.0)
    assert totals["forward"] == 1.0
    assert timer.gap == "start"


@TIMERS
def test_a_call_left_open_closes_at_the_step_end(make: Any) -> None:
    timer, totals = make(), zero()
    timer.begin_forward(0.0, totals)
    timer.step_ended(4.0, totals)
    assert totals["forward"] == 4.0 and timer.phase == "other"


@TIMERS
def test_a_call_open_at_the_step_end_leaves_no_gap_booked_twice(make: Any) -> None:
    """The opening gap is input (booked as data when the model's call begins); a call still
    open when the step ends closes there, and the gap before it is not booked again."""
    timer, totals = make(), zero()
    timer.input_shares = {"start": 1.0}
    timer.step_ended(0.0, totals)
    timer.begin_forward(2.0, totals)
    timer.step_ended(4.0, totals)
    assert totals["data_wait"] == 2.0 and totals["forward"] == 2.0


@TIMERS
def test_phases_nest_inside_the_optimizer(make: Any) -> None:
    """LBFGS: the closure's forward and backward run inside optimizer.step()."""
    timer, totals = make(), zero()
    timer.enter("optimizer", 0.0, totals)
    timer.begin_forward(1.0, totals)
    timer.end_forward(2.0, totals)
    timer.enter("backward", 2.0, totals)
    timer.exit("backward", 4.0, totals)
    timer.exit("optimizer", 5.0, totals)
    assert totals == {
        "data_wait": 0.0,
        "forward": 1.0,
        "evaluation": 0.0,
        "backward": 2.0,
        "optimizer": 2.0,
    }


def test_the_compiled_timer_does_what_the_python_one_does() -> None:
    """Both driven by the same 3,000 random events (phases opened and closed out of order,
    models called inside models, input shares, resets): the same results, totals, phase and
    gap after each, to the last bit."""
    import random

    rng = random.Random(7)
    timers = [PhaseTimer(), _compiled()]
    totals = [zero(), zero()]
    now = 0.0
    names = ["data", "forward", "evaluation", "backward", "optimizer", "nonsense"]
    events = ["enter", "exit", "begin", "end", "step", "inside", "shares", "reset"]
    for _ in range(3000):
        now += rng.random()
        event = rng.choice(events)
        name = rng.choice(names[:-1] if event == "enter" else names)
        segment = rng.choice(["forward", "evaluation"])
        shares = rng.choice([{}, {"forward": 0.5, "start": 1.0}, {"backward": 0.25}])
        results: list[Any] = []
        for timer, total in zip(timers, totals, strict=True):
            if event == "enter":
                results.append(timer.enter(name, now, total))
            elif event == "exit":
                results.append(timer.exit(name, now, total))
            elif event == "begin":
                results.append(timer.begin_forward(now, total, segment))
            elif event == "end":
                results.append(timer.end_forward(now, total))
            elif event == "step":
                results.append(timer.step_ended(now, total))
            elif event == "inside":
                results.append(timer.inside(name))
            elif event == "shares":
                timer.input_shares = dict(shares)
            elif segment == "forward" and name == "data":  # now and then
                timer.reset()
        assert len(set(map(repr, results))) <= 1, event
        assert totals[0] == totals[1], event
        assert (timers[0].phase, timers[0].gap) == (timers[1].phase, timers[1].gap), event
    assert all(totals[0].values())  # every phase was timed


# -- judging samples -------------------------------------------------------------------------
def _code(path: str, name: str) -> Any:
    """The code object of a function `name` as if defined in `path`."""
    namespace: dict[str, Any] = {}
    exec(compile(f"def {name}():\n    pass\n", path, "exec"), namespace)
    return namespace[name].__code__


TRAIN = "/home/user/train.py"
LOOP = _code(TRAIN, "main")
GET_BATCH = _code(TRAIN, "get_batch")
CALL = _code("/venv/site-packages/torch/nn/modules/module.py", "_call_impl")
BACKWARD = _code("/venv/site-packages/torch/_tensor.py", "backward")
ZERO_GRAD = _code("/venv/site-packages/torch/optim/optimizer.py", "zero_grad")
FORWARD = _code(TRAIN, "forward")


def _phase_samples(steps: int) -> list[Sample]:
    """Samples inside the model's call and backward(): they show the loop's frames."""
    out = []
    for step in range(steps):
        out.append(Sample(step, None, ((FORWARD, 20), (CALL, 1), (LOOP, 40))))
        out.append(Sample(step, None, ((BACKWARD, 1), (LOOP, 42))))
    return out


def _gap(step: int, gap: str, *frames: tuple[Any, int]) -> Sample:
    return Sample(step, gap, (*frames, (LOOP, 41)))


def test_get_batch_after_the_model_is_input() -> None:
    samples = _phase_samples(10)
    for step in range(10):
        samples += [_gap(step, "forward", (GET_BATCH, 5)) for _ in range(3)]
    samples.append(_gap(3, "forward"))  # one in the loop's own line
    samples += [_gap(s, "start", (ZERO_GRAD, 1)) for s in range(10)]
    found = judge(samples)
    assert found["input"]["function"] == "get_batch"
    assert found["input"]["gaps"] == {"forward": pytest.approx(30 / 31)}
    assert found["input"]["site"].endswith("train.py:41")
    assert found["gaps"]["start"]["top"][0]["function"] == "zero_grad"  # torch's: not input


@pytest.mark.parametrize(
    "name, extra, steps",
    [
        ("compute_loss", (), range(10)),  # a loss, by its name
        ("get_batch", ((CALL, 1),), range(10)),  # it runs a module: a forward of its own
        ("get_batch", (), [4]),  # in one step of ten: not the loop's input (an evaluation)
    ],
)
def test_what_is_not_input(name: str, extra: tuple[Any, ...], steps: Any) -> None:
    callee = _code(TRAIN, name)
    samples = _phase_samples(10)
    for step in steps:
        samples += [_gap(step, "forward", *extra, (callee, 5)) for _ in range(12)]
    found = judge(samples)
    assert "input" not in found
    assert found["gaps"]["forward"]["top"][0]["function"] == name


def test_a_trainers_own_loop_is_not_judged() -> None:
    """Under a trainer library the loop's frames are the library's: nothing is input."""
    fit = _code("/venv/site-packages/lightning/loops/fit.py", "advance")
    hook = _code("/venv/site-packages/lightning/trainer/call.py", "_call_callback_hooks")
    samples = [Sample(s, None, ((BACKWARD, 1), (fit, 9), (LOOP, 1))) for s in range(10)]
    samples += [Sample(s, "start", ((hook, 3), (fit, 8), (LOOP, 1))) for s in range(10)]
    assert "input" not in judge(samples)


def test_a_library_generator_is_input() -> None:
    """`for batch in dataset.iter(...)`: a library's generator the loop draws batches from."""
    namespace: dict[str, Any] = {}
    source = "def iter_batches():\n    yield 1\n"
    exec(compile(source, "/venv/site-packages/datasets/arrow.py", "exec"), namespace)
    generator = namespace["iter_batches"].__code__
    samples = _phase_samples(10)
    samples += [_gap(s, "start", (generator, 2)) for s in range(10) for _ in range(2)]
    assert judge(samples)["input"]["function"] == "iter_batches"


def test_without_samples_inside_a_phase_the_loop_is_unknown() -> None:
    samples = [_gap(s, "forward", (GET_BATCH, 5)) for s in range(20)]
    found = judge(samples)
    assert not found["loop_known"] and "input" not in found


def test_the_loop_is_known_from_the_lines_it_runs() -> None:
    """No sample inside a phase (a short forward, a fetch in Python that holds the GIL): the
    loop is the code that holds the line that called the model or backward()."""
    namespace: dict[str, Any] = {}
    exec(compile("\n" * 39 + "def main():\n    a = 1\n    b = 2\n", TRAIN, "exec"), namespace)
    loop = namespace["main"].__code__  # lines 40-42 of train.py
    samples = [Sample(s, "forward", ((GET_BATCH, 5), (loop, 41))) for s in range(20)]
    found = judge(samples, ((TRAIN, 42), None))  # main() called the model at line 42
    assert found["loop_known"] and found["input"]["function"] == "get_batch"
    assert "input" not in judge(samples, (("/elsewhere.py", 42), None))
