"""Findings that change their mind and tell one story: a finding that stops being true is
marked resolved at its step (the doctor's latest row of it, the summary, `diagnoses`, the
report); findings of one cause are one chain, earliest first; no two fixes of a run contradict
each other; a fix that needs a value it does not know says so."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from torchdoctor.config import Config
from torchdoctor.diagnose import load_modules, story
from torchdoctor.diagnose.evidence import decode
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.nan import BadWeight, NanOrigin, from_origin
from torchdoctor.diagnose.record import Diagnosis, Finding
from torchdoctor.doctor import LONGEST_WAIT, TICK, Doctor
from torchdoctor.report.diagnoses import render_full
from torchdoctor.report.summary import story_lines
from torchdoctor.store.saved import open_run
from torchdoctor.store.schema import DIAGNOSES, STEPS
from torchdoctor.store.tables import Tables

RUNS = Path(__file__).resolve().parent.parent / "fixtures" / "runs"


def _d(kind: str, step: int, **extra: Any) -> Diagnosis:
    return Diagnosis(kind, "error", f"{kind} at {step}", step=step, key=kind, **extra)


# -- chains ------------------------------------------------------------------------------------
def test_a_saved_run_that_explodes_diverges_and_goes_nan_is_one_chain() -> None:
    run = open_run(RUNS / "divergence_lr_schedule")
    found = [d for m in load_modules() for d in m.diagnose(Inputs.of_saved(run, Config()))]
    told = {d.kind: d for d in story.tell(found)}
    assert told["exploding_gradients"].follows is None  # the first: step 33
    assert told["divergence"].follows == "exploding_gradients"  # step 34
    assert told["nan"].follows == "divergence"  # step 46
    order = story.chains(list(told.values()), lambda d: d.kind, lambda d: d.follows)
    assert [[d.kind for d in chain] for chain in order] == [
        ["exploding_gradients", "divergence", "nan"]
    ]


def test_what_does_not_chain() -> None:
    far = story.tell([_d("divergence", 10), _d("nan", 10 + story.GAP + 1)])
    assert far[1].follows is None  # too far apart to be one story
    named = story.tell(
        [
            _d("divergence", 10, evidence=decode("divergence", {"non_finite_step": 500})),
            _d("nan", 500),
        ]
    )
    assert named[1].follows == "divergence"  # ... unless the divergence named its step
    data = story.tell(
        [_d("divergence", 10), _d("nan", 12, evidence=decode("nan", {"stage": "data"}))]
    )
    assert data[1].follows is None  # a bad batch follows nothing
    other_rank = story.tell([_d("divergence", 10), _d("nan", 12, rank=1)])
    assert other_rank[1].follows is None
    # Unchanged findings come back as they were: the doctor records only what changed.
    plain = _d("divergence", 3)
    assert story.tell([plain])[0] is plain


def test_gradients_never_cleared_head_their_chain_however_late_it_comes() -> None:
    # Gradients that pile up grow the norm update after update: it explodes long after the
    # first step that showed them never cleared (35 steps later on pytorch/examples' GCN with
    # its zero_grad() dropped), and the fixes point at the cause, not at clipping.
    late = 2 + story.GAP + 35
    told = story.tell(
        [
            _d("grad_not_cleared", 2),
            _d(
                "exploding_gradients",
                late,
                fix=["clip the gradient norm: x", f"{story.LOWER_LR} or a warm-up", "normalise"],
            ),
            _d(
                "divergence", late + 1, fix=[f"{story.LOWER_LR} (now 0.1)", "add gradient clipping"]
            ),
        ]
    )
    by = {d.kind: d for d in told}
    assert by["grad_not_cleared"].follows is None
    assert by["exploding_gradients"].follows == "grad_not_cleared"
    assert by["divergence"].follows == "exploding_gradients"
    assert by["exploding_gradients"].fix == [
        "fix grad_not_cleared first (step 2): this follows from it; clipping or a lower "
        "learning rate would only hide it",
        "normalise",
    ]
    assert len(by["divergence"].fix) == 1 and by["divergence"].fix[0].startswith("fix grad_")
    # Told again (the doctor tells its kept findings at every pass): the same fixes, not one
    # more pointer a pass (mnist_forward_forward without zero_grad() had five).
    again = {d.kind: d for d in story.tell(told)}
    assert again["exploding_gradients"].fix == by["exploding_gradients"].fix
    assert again["divergence"].fix == by["divergence"].fix
    order = story.chains(told, lambda d: d.kind, lambda d: d.follows)
    assert [[d.kind for d in c] for c in order] == [
        ["grad_not_cleared", "exploding_gradients", "divergence"]
    ]
    # Resolved, on another rank, or found after it: it heads nothing.
    resolved = dataclasses.replace(_d("grad_not_cleared", 2), resolved=50)
    assert story.tell([resolved, _d("exploding_gradients", 60)])[1].follows is None
    assert story.tell([_d("grad_not_cleared", 2), _d("divergence", 9, rank=1)])[1].follows is None
    assert story.tell([_d("grad_not_cleared", 9), _d("divergence", 3)])[1].follows is None


def test_zero_gradients_follow_the_loss_that_explains_them() -> None:
    # pytorch/examples' DDP tutorial: cross_entropy over one output is 0 on every step (step 1:
    # loss_inputs' single_class), so every gradient is zero (seen after 10 steps). The zero
    # gradients are told after their cause, on the same rank, and alone where nothing explains
    # them.
    told = story.tell([_d("zero_gradients", 10), _d("loss_inputs", 1)])
    assert [d.follows for d in told] == ["loss_inputs", None]
    order = story.chains(told, lambda d: d.kind, lambda d: d.follows)
    assert [[d.kind for d in c] for c in order] == [["loss_inputs", "zero_gradients"]]
    assert story.tell([_d("zero_gradients", 10)])[0].follows is None
    assert story.tell([_d("zero_gradients", 10), _d("loss_inputs", 1, rank=1)])[0].follows is None


# -- contradictions and unknown values ------------------------------------------------------
def test_not_learning_does_not_ask_for_a_larger_rate_when_the_run_diverged() -> None:
    flat = Diagnosis(
        "not_learning",
        "warning",
        "flat",
        step=120,
        key="not_learning",
        fix=["overfit one batch", f"{story.RAISE_LR} (now 1)", "check the optimizer"],
    )
    diverged = _d("divergence", 150, fix=[f"{story.LOWER_LR} (now 1)"])
    told = {d.kind: d for d in story.tell([flat, diverged])}
    fixes = told["not_learning"].fix
    assert not any(f.startswith(story.RAISE_LR) for f in fixes)
    assert fixes[1].startswith("do not raise the learning rate: divergence at step 150")
    assert told["not_learning"].fix[0] == "overfit one batch"
    resolved = story.tell([flat, Diagnosis(**{**diverged.__dict__, "resolved": 170})])
    assert resolved[0] is flat  # a divergence that no longer holds contradicts nothing


def test_a_fix_without_the_learning_rate_says_it_is_not_known() -> None:
    assert story.lr_now(0.1) == "(now 0.1)"
    assert "not known" in story.lr_now(None) and "None" not in story.lr_now(None)
    weights = [BadWeight(module="fc", param="weight", numel=4)]
    origin = NanOrigin(stage="optimizer", step=3, lr=None, bad_weights=weights)
    d = from_origin(origin)
    assert all("None" not in f for f in d.fix)
    assert any(f.startswith(story.LOWER_LR) and "not known" in f for f in d.fix)


def test_a_sqrt_nan_is_not_blamed_on_the_learning_rate() -> None:
    origin = NanOrigin(
        stage="backward", step=14, module="distance", node="SqrtBackward0", op="torch.sqrt", lr=0.1
    )
    fixes = from_origin(origin).fix
    assert fixes[0].startswith("keep the argument positive")
    assert not any(story.LOWER_LR in f or "clip" in f for f in fixes)
    # ... unless the gradients were growing before it
    d = from_origin(origin)
    from torchdoctor.diagnose.nan import StepHistory, rank_causes

    loss = [1.0, 0.9, 0.95, 0.92]
    rising = StepHistory(steps=[10, 11, 12, 13], loss=loss, grad_norm=[1.0, 1.0, 5.0, 80.0])
    assert any(c.fix.startswith(story.LOWER_LR) for c in rank_causes(origin, rising))
    assert d.fix == fixes


def test_the_graph_of_a_step_not_replayed_names_its_risky_ops() -> None:
    """A sharded model is not run again: the ops of the step's graph that make NaN/Inf of
    ordinary values stand for the op (nearest the loss first), not the safe look-alikes."""
    import torch

    from torchdoctor.telemetry.nan_replay import _risky_nodes

    x = torch.randn(4, 3, requires_grad=True)
    hidden = torch.log(torch.relu(x)) / x.sum()  # LogBackward0, then DivBackward0
    safe = torch.softmax(hidden, -1).pow(2) + x.sigmoid()
    loss = safe.mean() + torch.log_softmax(x, -1).mean()
    assert _risky_nodes(loss) == ["DivBackward0", "LogBackward0"]
    assert _risky_nodes(x.pow(2).sum()) == [] and _risky_nodes(None) == []
    origin = NanOrigin(stage="unknown", step=0, sharded=True, graph_ops=["LogBackward0"])
    d = from_origin(origin)
    assert "graph holds LogBackward0" in d.summary
    assert d.fix[0].startswith("clamp before the log"), d.fix
    assert not any(story.LOWER_LR in f for f in d.fix)  # step 0: no update has run


# -- the doctor: resolved findings and the story, live ----------------------------------------
class _Host:
    def __init__(self) -> None:
        self.tables = Tables()
        self.config = Config()
        self.started = time.time()
        self.waiting = False
        self.resumed = 0.0
        self.telemetry = None
        self.alerts: list[Diagnosis] = []

    def save_diagnoses(self) -> None:
        pass

    def alert(self, diagnosis: Diagnosis) -> None:
        self.alerts.append(diagnosis)

    def job(self) -> None:
        return None


def _steps(host: _Host, losses: np.ndarray, start: int = 0, wait: float = 0.0) -> None:
    row = STEPS.row_type()
    now = time.time()
    for i, loss in enumerate(losses, start):
        phases = (0.01, wait, 0.004, 0.004, 0.001, 0.001)  # duration, data, fwd, bwd, opt, other
        memory = (0, 0, 0, 0)
        host.tables["steps"].append(
            row(i, now, *phases, float(loss), 1.0, 0.1, *memory, 0, 1, False, False)
        )


def _rows(host: _Host) -> list[dict[str, Any]]:
    block = host.tables["diagnoses"].snapshot()
    return [dict(zip(DIAGNOSES.column_names, r.values(), strict=True)) for r in block.to_records()]


def test_a_plateau_that_ends_is_resolved_at_its_step() -> None:
    """word_language_model: a long plateau, then the loss falls from 5.5 to 2.6."""
    host = _Host()
    doctor = Doctor(host)
    rng = np.random.default_rng(0)
    _steps(host, 5.5 + 0.01 * rng.standard_normal(150))
    assert [d.kind for d in doctor.examine()] == ["not_learning"]
    _steps(host, np.linspace(5.5, 2.6, 100), start=150)
    doctor.examine()  # gone from one pass: not yet (a share at its threshold may flicker)
    assert [d.resolved for d in doctor.found()] == [None]
    doctor.examine()
    (latest,) = doctor.found()
    assert latest.kind == "not_learning" and latest.resolved == 249
    rows = _rows(host)
    assert [r["resolved"] for r in rows] == [None, 249]  # the latest row is its state
    assert host.alerts[-1].resolved == 249  # said on stderr too (unless quiet)
    text = render_full([Finding.from_row(r) for r in rows])
    assert text.count("not_learning") == 1  # one finding, in its latest state
    assert "(resolved: no longer holds from step 249)" in text
    lines = story_lines(doctor.found())
    assert lines[0] == "1 diagnosis (1 resolved):"
    assert lines[1].startswith("torchdoctor resolved [not_learning]: it no longer holds from step")


def test_a_finding_that_comes_back_is_new() -> None:
    host = _Host()
    doctor = Doctor(host)
    falling = np.linspace(3.0, 1.0, 60)
    _steps(host, falling, wait=0.008)  # 80% of each step waits for data
    assert [d.kind for d in doctor.examine()] == ["dataloader_bound"]
    _steps(host, falling, start=60)
    doctor.examine()
    doctor.examine()
    assert [d.resolved for d in doctor.found()] == [119]
    _steps(host, falling, start=120, wait=0.008)
    again = doctor.examine()
    assert [(d.kind, d.resolved) for d in again] == [("dataloader_bound", None)]
    assert [r["resolved"] for r in _rows(host)] == [None, 119, None]


def test_a_plateau_then_a_divergence_tells_one_story() -> None:
    host = _Host()
    doctor = Doctor(host)
    rng = np.random.default_rng(1)
    _steps(host, 3.0 + 0.01 * rng.standard_normal(150))
    doctor.examine()
    _steps(host, 3.0 * 4.0 ** np.arange(1, 12), start=150)  # then it runs away
    doctor.examine()
    found = {d.kind: d for d in doctor.found()}
    assert {"not_learning", "divergence"} <= set(found)
    assert any(f.startswith(story.LOWER_LR) for f in found["divergence"].fix)
    assert not any(f.startswith(story.RAISE_LR) for f in found["not_learning"].fix)
    rows = [r for r in _rows(host) if r["kind"] == "not_learning"]
    assert story.RAISE_LR in rows[0]["fix"] and story.RAISE_LR not in rows[-1]["fix"]


def test_the_doctors_first_passes_come_a_tick_apart_whatever_they_cost() -> None:
    # A pass that cost c seconds of CPU waits c / SHARE for the next while the training steps;
    # the first passes pay for first calls and imports (the diagnoses load on the first), so
    # the first three come a TICK apart: a rank that raises in its first seconds is seen.
    class Training:
        steps_done = 0

    host = _Host()
    host.telemetry = Training()  # type: ignore[assignment]
    doctor = Doctor(host)
    waits = []
    for cost in (0.5, 0.4, 0.3, 0.002):
        Training.steps_done += 1  # the training stepped since the last pass
        waits.append(doctor._next_wait(cost))
    assert waits == [TICK, TICK, LONGEST_WAIT, TICK]  # then the least of the last three
    # With a short hang timeout judged (a job's: half its group's 12 s), a dear pass waits a
    # quarter of it at most: a rank that stops stepping is named before the group times out.
    doctor._hang_after = 6.0
    for cost in (0.5, 0.4, 0.3):
        Training.steps_done += 1
        wait = doctor._next_wait(cost)
    assert wait == 1.5  # not LONGEST_WAIT
