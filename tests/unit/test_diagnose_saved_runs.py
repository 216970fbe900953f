"""Every diagnosis judged in milliseconds on saved runs of real buggy and fixed scripts.

The runs under tests/fixtures/runs/ were recorded by `torchdoctor run` from the scripts in
tests/scripts/ (tests/fixtures/runs/regenerate.py re-records them). What each must be
diagnosed with is written here, not generated: a change to a diagnosis that moves a finding
shows up as a failing row of this table. Hangs are judged on real stacks of real threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.config import Config
from torchdoctor.diagnose import load_modules
from torchdoctor.diagnose.inputs import HangCapture, Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import ThreadStack
from torchdoctor.store.saved import open_run
from torchdoctor.telemetry.stacks import capture_all

RUNS = Path(__file__).resolve().parent.parent / "fixtures" / "runs"
SEVERITY = {"info": 0, "warning": 1, "error": 2}


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    return [d for module in load_modules() for d in module.diagnose(inputs)]


def judged(name: str) -> dict[str, Diagnosis]:
    run = open_run(RUNS / name)
    found = diagnose(Inputs.of_saved(run, Config()))
    return {d.kind: d for d in found}


# fixture -> {kind: (severity, location ends with, first step, last step)}; None: any
BUGGY: dict[str, dict[str, tuple[str, str | None, int, int]]] = {
    "nan_forward_log": {"nan": ("error", "head", 9, 9)},
    "nan_backward_sqrt": {"nan": ("error", "distance", 14, 14)},
    "nan_optimizer_adam_eps": {"nan": ("error", "embed", 1, 1)},
    "nan_data": {"nan": ("error", "input batch", 10, 10)},
    "divergence_lr_schedule": {
        "divergence": ("error", None, 20, 45),  # before the NaN, the earlier the better
        "nan": ("error", "diag_lr_schedule.py:33", 46, 46),
        "exploding_gradients": ("error", "head", 20, 46),
    },
    "vanishing_deep_sigmoid": {"vanishing_gradients": ("warning", "0", 21, 29)},
    "no_gradient_frozen": {"no_gradient": ("warning", "image.0", 21, 24)},
    "not_learning_lr_zero": {
        "not_learning": ("warning", None, 100, 149),
        "lr_zero": ("warning", None, 19, 19),  # the cause, as soon as it is certain
    },
    "dataloader_bound_slow": {"dataloader_bound": ("warning", None, 40, 40)},
    "memory_leak_eval": {"memory_leak": ("warning", None, 60, 119)},
    # silent training bugs: the cause, the place, within the first steps (docs/silent-errors.md)
    "silent_grad_not_cleared": {"grad_not_cleared": ("error", "silent_zero_grad.py:22", 2, 2)},
    "silent_accumulation": {"accumulation": ("warning", "silent_accumulation.py:29", 2, 3)},
    "silent_eval_mode": {"eval_mode": ("warning", "silent_eval_mode.py:25", 2, 2)},
    "silent_train_not_called": {"train_not_called": ("warning", "backbone", 1, 1)},
    "silent_dropout_in_eval": {"dropout_in_eval": ("warning", "silent_dropout_eval.py:24", 9, 10)},
    "silent_unoptimized_parameters": {
        "unoptimized_parameters": ("warning", "fc", 2, 3),
        "no_gradient": ("warning", "?", 21, 24),  # the replaced head's old tensors
    },
    "silent_frozen_model": {"frozen_model": ("warning", "_fc", 1, 1)},
    "silent_scheduler_order": {
        "scheduler_order": ("warning", "silent_scheduler_order.py:21", 0, 0)
    },
    "silent_scheduler_unused": {
        "scheduler_unused": ("warning", "silent_scheduler_unused.py:19", 10, 10)
    },
    "silent_detached_loss": {
        "detached_loss": ("error", "silent_detached_loss.py:24", 2, 2),
        "no_gradient": ("warning", "0", 21, 24),
    },
    "silent_repeated_batch": {"repeated_batch": ("warning", "model", 3, 3)},
    "silent_loss_inputs": {"loss_inputs": ("error", "silent_loss_inputs.py:75", 1, 1)},
    "silent_ineffective_update": {
        "ineffective_update": ("error", "silent_update_effect.py:37", 2, 2)
    },
    "silent_autocast_unused": {"autocast_unused": ("warning", "silent_autocast.py:31", 1, 1)},
    "silent_batch_collapsed": {"batch_collapsed": ("warning", "model", 3, 3)},
}

HEALTHY = (
    "healthy_lr_schedule",
    "healthy_deep_sigmoid",
    "healthy_frozen",
    "healthy_slow_loader",
    "healthy_eval_leak",
    "healthy_rl_episodes",  # its loss grows with its episodes: not a learning curve (rollout.py)
    *sorted(p.name for p in RUNS.glob("healthy_silent_*")),  # fixed twins, legitimate patterns
)


@pytest.mark.parametrize("name", sorted(BUGGY))
def test_buggy_run_is_diagnosed(name: str) -> None:
    found = judged(name)
    expected = BUGGY[name]
    assert set(found) == set(expected), {k: d.summary for k, d in found.items()}
    for kind, (severity, where, first, last) in expected.items():
        d = found[kind]
        assert d.severity == severity, (kind, d.severity, d.summary)
        if where is not None:
            assert (d.location or "").endswith(where), (kind, d.location)
        assert d.step is not None and first <= d.step <= last, (kind, d.step)
        assert d.summary and d.fix, (kind, "a finding says what is wrong and what to do")


@pytest.mark.parametrize("name", HEALTHY)
def test_fixed_run_has_no_finding_above_info(name: str) -> None:
    found = judged(name)
    loud = {k: d.summary for k, d in found.items() if SEVERITY[d.severity] > 0}
    assert not loud, loud


def test_a_pass_over_every_run_takes_milliseconds() -> None:
    inputs = [Inputs.of_saved(open_run(RUNS / n), Config()) for n in [*BUGGY, *HEALTHY]]
    diagnose(inputs[0])  # imports
    t0 = time.perf_counter()
    for i in inputs:
        diagnose(i)
    per_run = (time.perf_counter() - t0) / len(inputs)
    assert per_run < 0.5, f"{per_run * 1e3:.0f} ms per run"  # a budget, not a benchmark


# -- hangs, on the stacks of real threads --------------------------------------------------


def _stuck(target: Any, *args: Any) -> Iterator[list[ThreadStack]]:
    """Run `target` in a thread until it is blocked, then capture every stack with that thread
    standing in for the main thread."""
    thread = threading.Thread(target=target, args=args, daemon=True, name="stuck")
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            threads = capture_all()
            mine = next(t for t in threads if t.name == "stuck")
            if any(f.func == "innermost" for f in mine.frames):
                break
            assert time.monotonic() < deadline, "the thread never reached its blocking call"
            time.sleep(0.001)
        for t in threads:
            t.is_main = t is mine
        yield threads
    finally:
        release.set()
        thread.join(10)


release = threading.Event()


def load_batch(event: threading.Event) -> None:
    def innermost() -> None:
        event.wait()  # a read that never returns

    innermost()


def spin(event: threading.Event) -> None:
    def innermost() -> None:
        while not event.is_set():  # a loop whose exit condition never comes
            pass

    innermost()


@pytest.mark.parametrize(("target", "category"), [(load_batch, "lock"), (spin, "user_code")])
def test_hang_names_the_category_and_the_user_line(target: Any, category: str) -> None:
    release.clear()
    for threads in _stuck(target, release):
        capture = HangCapture(seconds=312.0, timeout=300.0, steps=17, threads=threads)
        run = open_run(RUNS / "healthy_frozen")
        inputs = Inputs.of(run.block, Config(), hang=capture)
        found = {d.kind: d for d in diagnose(inputs)}
        hang = found["hang"]
        assert hang.severity == "error" and hang.step == 17
        assert hang.evidence.category == category, hang.summary
        file, line = (hang.location or ":").rsplit(":", 1)
        assert Path(file).name == Path(__file__).name, hang.location
        source = Path(__file__).read_text().splitlines()[int(line) - 1]
        assert "event.wait()" in source or "while not event.is_set()" in source, source


def test_hang_in_a_pending_collective_names_it_and_the_other_ranks() -> None:
    # The main thread stands at the line that issued a collective still pending (DDP's
    # gradient all-reduce waits inside loss.backward(), which issued it): it waits for another
    # rank, not in the user's own code. A collective pending elsewhere (async_op=True) does not
    # count.
    release.clear()
    for threads in _stuck(load_batch, release):
        main = next(t for t in threads if t.is_main)
        user = next(f for f in main.frames if f.func == "innermost")
        site = user.site
        now = time.time()
        pending = [
            {"group": "default", "seq": 9, "op": "all_reduce", "site": "other.py:3", "step": 4,
             "time": now - 60, "peer": None, "shapes": "[[65]]", "dtype": "float32"},
            {"group": "default", "seq": 10, "op": "all_reduce", "site": site, "step": 5,
             "time": now - 7, "peer": None, "shapes": "[[65]]", "dtype": "float32"},
        ]  # fmt: skip
        capture = HangCapture(seconds=8.0, timeout=3.0, steps=5, threads=threads, pending=pending)
        run = open_run(RUNS / "healthy_frozen")
        hang = _hang(Inputs.of(run.block, Config(), now=now, hang=capture))
        assert hang.evidence.category == "collective", hang.summary
        assert hang.evidence.collective is not None and hang.evidence.collective.seq == 10
        assert hang.location is not None and hang.location.endswith(f":{user.lineno}")
        assert "waits in collective all_reduce #10, issued at" in hang.summary
        assert "at step 5, for 7 s" in hang.summary and "cluster diagnoses" in hang.summary
        assert "your own code" not in hang.summary
        elsewhere = dict(capture.__dict__, pending=pending[:1])
        hang = _hang(Inputs.of(run.block, Config(), now=now, hang=HangCapture(**elsewhere)))
        assert hang.evidence.category == "lock" and hang.evidence.collective is None


def _hang(inputs: Inputs) -> Diagnosis:
    return next(d for d in diagnose(inputs) if d.kind == "hang")
