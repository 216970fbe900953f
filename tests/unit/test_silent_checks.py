"""The silent-error checks' own pieces (telemetry/silent/): when they sample, the arithmetic that
tells cleared gradients from accumulated ones (numpy on CPU, torch on a GPU: the same numbers),
how a loss's scaling is read from its graph, and the watched methods staying what they were
(`nn.Module.train` is still the function, torch's own warnings still name the caller; the
wrapped `torch.nn.init` functions keep their names, signatures, values and warnings), and what
a forked child finds of them (its parent's taken off; a probe of its own over any left)."""

from __future__ import annotations

import inspect
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import internal_errors
from torch import nn
from torch.optim import optimizer as optimizer_module

import torchdoctor
from torchdoctor import session
from torchdoctor.telemetry.patches import Hooks, unpatched
from torchdoctor.telemetry.silent.grad_reset import _readings
from torchdoctor.telemetry.silent.inits import INIT_FUNCTIONS
from torchdoctor.telemetry.silent.loss_graph import _reaches, _scale
from torchdoctor.telemetry.silent.pacing import MAX_PERIOD, Pacing
from torchdoctor.telemetry.step import StepState


def _pace(pacing: Pacing, busy: dict[int, float], steps: int, full: bool = False) -> list[int]:
    """Run `pacing` over `steps` steps, each step `busy.get(step, 1.0)` seconds long (no
    DataLoader wait); the sampled steps (`full`: those every check looks at)."""
    clock, out = 0.0, []
    for step in range(steps):
        state = StepState(clock)
        clock += busy.get(step, 1.0)
        if pacing.full(step) if full else pacing.sampled(step):
            out.append(step)
        pacing.step_ended(state, step, clock)
    return out


def test_sampled_steps_are_the_first_three_then_a_pair_in_every_fifty() -> None:
    assert _pace(Pacing(budget=None), {}, 210) == [1, 2, 3, 50, 51, 100, 101, 150, 151, 200, 201]
    assert _pace(Pacing(budget=None), {}, 210, full=True) == [1, 2, 3, 50, 100, 150, 200]


def test_costly_pairs_are_spread_to_keep_within_the_budget() -> None:
    # A pair whose steps take 3 s where the step before took 1 s: 4 s extra, 1% of the
    # training time is 0.01 s a step, so the next pair comes 400 steps later.
    costly = {step: 3.0 for step in (50, 51, 450, 451)}
    assert _pace(Pacing(), costly, 900) == [1, 2, 3, 50, 51, 450, 451, 850, 851]
    # Cheap pairs (a large model's: 1% more) stay PERIOD apart.
    cheap = {step: 1.01 for step in range(50, 400)}
    assert _pace(Pacing(), cheap, 160) == [1, 2, 3, 50, 51, 100, 101, 150, 151]
    # Never further apart than MAX_PERIOD (a pair measured in a stall).
    stalled = {50: 1e6}
    assert _pace(Pacing(), stalled, MAX_PERIOD + 60)[-2:] == [50 + MAX_PERIOD, 51 + MAX_PERIOD]
    # A DataLoader wait is not the checks' cost.
    waited = StepState(0.0)
    waited.phases["data_wait"] = 2.0
    pacing = Pacing()
    pacing.step_ended(StepState(0.0), 49, 1.0)
    pacing.step_ended(waited, 50, 3.0)
    pacing.step_ended(StepState(0.0), 51, 1.0)
    assert pacing.pair == 100


@pytest.mark.usefixtures("uncompiled")
def test_a_tiny_models_pairs_are_spread_by_what_they_cost(tmp_path: Path) -> None:
    # A tiny model's sampled step costs a few ordinary ones (the checks' tensor operations
    # against a step of three small ones): measured in a real loop, the pair at 50 and 51
    # puts the next one well past 100; every step between is an ordinary one.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 8)
    with torchdoctor.Session(tmp_path, quiet=True, trace_every=0) as session:
        recorder = session.ensure_telemetry()
        assert recorder is not None
        sampled: list[int] = []
        # a step listener runs after the silent checks chose whether the next step is sampled
        recorder.step_listeners.append(
            lambda _state, step: sampled.append(step + 1) if recorder.silent.active else None
        )
        for _ in range(120):
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        pacing = recorder.silent.pacing
    assert sampled == [1, 2, 3, 50, 51]
    assert pacing.pair > 150, pacing.pair


def _vectors(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=300), rng.normal(size=300), rng.normal(size=300)


@pytest.mark.parametrize(
    ("case", "expected"),
    [("kept", (0, 1)), ("cleared", (1, 0)), ("last", (1, 1))],
)
def test_readings_tell_kept_from_cleared_gradients(case: str, expected: tuple[int, int]) -> None:
    before, older, last = _vectors(0)
    total = older + last
    g = {"kept": 0.5 * (before + total), "cleared": 2.0 * total, "last": 0.7 * last}[case]
    readings = _readings(np, g, before, total, last, np.zeros(()))
    kept, cleared, last_r, factor, _share, _incoming, untouched = readings
    assert untouched == 0
    # the residuals come from dot products: a match reads about 1e-8 (the product's MATCH is 1e-3)
    small = [kept < 1e-6, cleared < 1e-6]
    assert small == [bool(e == 0) for e in expected], (kept, cleared)
    if case == "kept":
        assert factor == pytest.approx(0.5)
    if case == "last":
        assert last_r < 1e-6 and kept > 1e-2 and cleared > 1e-2


def test_readings_are_the_same_in_numpy_and_torch() -> None:
    before, total, last = _vectors(1)
    g = 0.3 * (before + total) + 1e-4 * last
    as_numpy = _readings(np, g, before, total, last, np.ones(()))
    t = [torch.from_numpy(v) for v in (g, before, total, last)]
    as_torch = _readings(torch, *t, torch.ones(()))  # float32: read as float64 with the rest
    assert as_torch.dtype == torch.float64 and float(as_torch[-1]) == 1.0
    assert [float(x) for x in as_torch] == pytest.approx([float(x) for x in as_numpy], rel=1e-9)


def test_the_scale_of_a_loss_is_read_from_its_graph() -> None:
    x = torch.randn(4, requires_grad=True)
    loss = (x * x).mean()
    assert _scale(torch, loss.grad_fn) is None  # not divided
    assert _scale(torch, (loss / 4).grad_fn) == 4
    assert _scale(torch, (loss / 4.0).grad_fn) == 4
    assert _scale(torch, (loss * 0.25).grad_fn) == 4
    assert _scale(torch, (loss / torch.tensor(517.0)).grad_fn) == "tensor"  # a token count
    assert _scale(torch, (loss / 2.5).grad_fn) == "other"
    assert _scale(torch, (loss / 1).grad_fn) is None
    # Hugging Face's Trainer: the model's sum over tokens divided by their count, then / 1 * 1
    tokens = torch.tensor(64.0)
    assert _scale(torch, ((x * x).sum() / tokens / 1 * 1).grad_fn) == "tensor"
    assert _scale(torch, (loss / 4 / 1 * 1).grad_fn) == 4


def test_a_detached_loss_reaches_no_parameter_and_a_model_output_does() -> None:
    model = nn.Linear(3, 1)
    ids = {id(p) for p in model.parameters()}
    out = model(torch.randn(2, 3)).sum()
    assert _reaches(out.grad_fn, ids, nn.Parameter)[0] is True
    rebuilt = torch.tensor(out.item(), requires_grad=True)
    assert _reaches(rebuilt.grad_fn, ids, nn.Parameter) == (False, [])
    cut = (model(torch.randn(2, 3)).detach().requires_grad_() * 2).sum()
    reaches, leaves = _reaches(cut.grad_fn, ids, nn.Parameter)
    assert reaches is False and leaves == [{"shape": [2, 1], "parameter": False}]


def test_watched_methods_stay_what_they_were(tmp_path: Path) -> None:
    original = nn.Module.train
    with torchdoctor.Session(tmp_path / "run", quiet=True):
        assert nn.Module.train is original  # looked up on the class: the function itself
        model = nn.Linear(2, 2)
        assert model.train() is model and model.eval() is model and not model.training
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            scheduler.step()  # before optimizer.step(): torch warns, naming this line
        assert caught and Path(caught[0].filename).name == Path(__file__).name
    assert nn.Module.__dict__["train"] is original


def test_wrapped_init_functions_stay_what_they_were(tmp_path: Path) -> None:
    originals = {name: nn.init.__dict__[name] for name in INIT_FUNCTIONS}
    with torchdoctor.Session(tmp_path / "run", quiet=True):
        wrapped = nn.init.kaiming_uniform_
        assert wrapped is not originals["kaiming_uniform_"]
        assert wrapped.__name__ == "kaiming_uniform_" and wrapped.__doc__
        assert inspect.signature(wrapped) == inspect.signature(originals["kaiming_uniform_"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            nn.init.kaiming_uniform_(torch.empty(0, 4))  # torch warns, naming this line
            nn.init.kaiming_normal_(torch.empty(3, 0))
        assert [Path(w.filename).name for w in caught] == [Path(__file__).name] * 2
        with pytest.raises(ValueError) as raised:
            nn.init.xavier_uniform_(torch.empty(3))  # fewer than 2 dimensions
        seeded = []
        for init in (nn.init.orthogonal_, originals["orthogonal_"]):
            torch.manual_seed(0)
            seeded.append(init(torch.empty(4, 4)))
        assert torch.equal(*seeded)
    assert "fewer than 2 dimensions" in str(raised.value)
    assert {name: nn.init.__dict__[name] for name in INIT_FUNCTIONS} == originals


@pytest.mark.usefixtures("uncompiled")  # the watch is off in a process that compiled
def test_a_warning_under_the_eval_watch_names_the_callers_line(tmp_path: Path) -> None:
    # pytorch/examples' mnist_rnn: Dropout2d on a 2-D input warns (stacklevel=2, naming
    # torch's Dropout2d.forward); under the dropout watch of an eval call it named
    # torchdoctor's modes.py, a new location, so Python showed it a second time.
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout2d(0.5), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.Session(tmp_path / "run", quiet=True) as s:
        for _ in range(2):
            optimizer.zero_grad()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model(torch.randn(3, 4)).sum().backward()
            optimizer.step()
        model.eval()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model(torch.randn(3, 4))  # watched: the first eval call
        assert s.telemetry is not None and s.telemetry.silent.modes.eval_calls == 1
    where = {(Path(w.filename).parts[-3:], w.lineno) for w in caught if "2-D" in str(w.message)}
    forward = inspect.getsourcelines(nn.Dropout2d.forward)
    line = forward[1] + next(i for i, t in enumerate(forward[0]) if "F.dropout2d" in t)
    assert where == {(("nn", "modules", "dropout.py"), line)}


def test_a_patch_of_an_inherited_attribute_is_undone_by_deleting_it() -> None:
    class Base:
        def hello(self) -> str:
            return "base"

    class Child(Base):
        pass

    hooks = Hooks()
    assert hooks.patch(Child, "hello", lambda self: "patched") is Base.__dict__["hello"]
    assert Child().hello() == "patched"
    hooks.remove()
    assert "hello" not in Child.__dict__ and Child().hello() == "base"


def test_a_probe_over_its_parents_switched_off_patches_wraps_the_originals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a forked child that starts a probe of its own finds (a forked rank, or
    # torchdoctor.start() in a child of mp.Process): its parent's patches still in place,
    # switched off by the fork handler. It wraps what they wrap: no failure reading their
    # code, and torch's warnings still name the caller's line, not a wrapper of ours.
    train, init = nn.Module.__dict__["train"], nn.init.__dict__["kaiming_uniform_"]
    parent = torchdoctor.Session(tmp_path / "parent", quiet=True).__enter__()
    try:
        session._forget_in_child()  # what os.fork's handler does in the child
        with torchdoctor.Session(tmp_path / "child", quiet=True):
            assert unpatched(nn.Module.__dict__["train"]) is train
            assert unpatched(nn.init.__dict__["kaiming_uniform_"]) is init
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                nn.init.kaiming_uniform_(torch.empty(0, 4))
            assert [Path(w.filename).name for w in caught] == [Path(__file__).name]
            model = nn.Linear(2, 2)
            assert model.train() is model and nn.Module.train is train
    finally:
        session._forked_from = None
        parent.__exit__(None, None, None)
    assert not internal_errors(capsys.readouterr().err)
    assert nn.Module.__dict__["train"] is train and nn.init.__dict__["kaiming_uniform_"] is init


def test_in_a_fork_the_patches_and_torch_hooks_come_off_and_callbacks_stay() -> None:
    class Owner:
        def f(self) -> str:
            return "own"

    own, called = Owner.__dict__["f"], []
    hooks, nested = Hooks(), Hooks()
    hooks.patch(Owner, "f", lambda self: "patched")
    hooks.handle(nn.modules.module.register_module_forward_pre_hook(lambda m, a: None))
    hooks.on_remove(lambda: called.append("callback"))
    hooks.nest(nested, undo=lambda: called.append("nested undo"))
    nested.patch(Owner, "g", lambda self: "nested")
    hooks.remove_in_fork()
    assert Owner.__dict__["f"] is own and "g" not in Owner.__dict__
    assert not nn.modules.module._global_forward_pre_hooks
    assert called == [] and len(hooks) == len(nested) == 0


def test_a_forked_child_of_a_probed_process_runs_on_torch_as_it_was(tmp_path: Path) -> None:
    # The fork handler takes the parent's patches and torch hooks off in the child: a trainer
    # forked from a probed process (mnist_hogwild with fork) steps at its plain speed, and a
    # probe it starts installs on torch as it was.
    train = nn.Module.__dict__["train"]
    step_hooks = optimizer_module._global_optimizer_pre_hooks
    with torchdoctor.Session(tmp_path / "run", quiet=True):
        assert nn.Module.__dict__["train"] is not train and step_hooks
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: say what it finds, and go
            found = (
                nn.Module.__dict__["train"] is train,
                not optimizer_module._global_optimizer_pre_hooks,
                not nn.modules.module._global_forward_pre_hooks,
                session.current() is None,
            )
            os.write(write, repr(found).encode())
            os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read) as f:
            found = f.read()
        assert status == 0 and found == repr((True, True, True, True)), found
        assert nn.Module.__dict__["train"] is not train and step_hooks  # the parent's stay
