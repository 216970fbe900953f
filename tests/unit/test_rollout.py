"""A rollout (an RL policy fed one observation at a time, one update per episode) is told from
a loop that calls its model on batches, and the loss- and norm-scale diagnoses leave it alone:
its loss and gradient norm grow with its episodes. The recorded run of such a loop is judged in
test_diagnose_saved_runs.py (healthy_rl_episodes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from helpers import series_inputs

from torchdoctor.config import Config
from torchdoctor.diagnose import divergence, exploding_gradients, not_learning, unattributed_time
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.rollout import MIN_CALLS, is_rollout, one_observation
from torchdoctor.store.columns import Block
from torchdoctor.store.saved import open_run
from torchdoctor.store.schema import SHAPES


@pytest.mark.parametrize(
    ("shapes", "one"),
    [
        ("[4]", True),  # an observation without a batch dimension
        ("[1, 4]", True),
        ("[1, 4, 84, 84], [1]", True),  # a batch of one frame stack
        ("[32, 4]", False),
        ("[8, 3, 32, 32], [8]", False),
        ("", False),  # no tensor argument
    ],
)
def test_one_observation(shapes: str, one: bool) -> None:
    assert one_observation(shapes) is one


def _with_calls(inputs: Inputs, per_step: dict[int, tuple[int, str]]) -> Inputs:
    """`inputs` whose python.shapes has, for each traced step, that many calls of the model
    (depth 0) with that input, each with one call of a child module."""
    rows = []
    for step, (calls, shape) in per_step.items():
        for call in range(calls):
            for depth, module in ((0, "model"), (1, "model.0")):
                rows.append((step, 2 * call + depth, module, "Linear", depth, shape))
    widths = len(SHAPES.columns) - 6
    block = Block.from_rows(SHAPES, [(*r, *([None] * widths)) for r in rows])
    return dataclasses.replace(inputs, read_shapes=lambda: block)


def test_a_rollout_is_many_calls_on_one_observation_in_a_step() -> None:
    base = series_inputs([1.0] * 10)
    assert not is_rollout(base)  # nothing traced
    assert is_rollout(_with_calls(base, {0: (MIN_CALLS, "[4]")}))
    assert not is_rollout(_with_calls(base, {0: (MIN_CALLS - 1, "[1, 4]")}))
    # gradient accumulation, crops, a GAN: many calls, each on a batch
    assert not is_rollout(_with_calls(base, {0: (8, "[16, 4]"), 20: (8, "[16, 4]")}))


def _growing_episodes() -> tuple[list[float], list[float]]:
    """An RL run whose episodes grow tenfold at step 150: its summed loss and its gradient
    norm with them (noisy, as a policy gradient is)."""
    rng = np.random.default_rng(0)
    length = np.where(np.arange(200) < 150, 10.0, 120.0)
    loss = length * 0.2 * np.exp(rng.normal(0, 0.3, 200))
    norms = length * 0.5 * np.exp(rng.normal(0, 0.3, 200))
    return loss.tolist(), norms.tolist()


def test_an_episode_that_grows_is_no_explosion_and_no_flat_loss() -> None:
    loss, norms = _growing_episodes()
    plain = series_inputs(loss, norms, [1e-2] * len(loss))
    rollout = _with_calls(plain, {0: (10, "[4]"), 20: (12, "[4]")})
    # the premise: judged as a batch loop, the growth reads as both
    assert exploding_gradients.diagnose(plain)
    assert not_learning.diagnose(plain)
    assert not exploding_gradients.diagnose(rollout)
    assert not not_learning.diagnose(rollout)


def test_a_loss_summed_over_longer_and_longer_episodes_is_no_divergence() -> None:
    rng = np.random.default_rng(1)
    length = np.concatenate([np.full(60, 10.0), np.geomspace(10, 3000, 140)])
    loss = (0.1 * length * np.exp(rng.normal(0, 0.1, 200))).tolist()
    plain = series_inputs(loss)
    assert [d.severity for d in divergence.diagnose(plain)] == ["warning"]  # the premise
    assert not divergence.diagnose(_with_calls(plain, {0: (10, "[1, 4]")}))
    # 10^4x above where it was is still said, rollout or not
    loss[-1] = 1e4 * loss[0]
    rollout = _with_calls(series_inputs(loss), {0: (10, "[1, 4]")})
    assert [d.severity for d in divergence.diagnose(rollout)] == ["error"]


def test_a_spike_in_a_rollout_is_still_an_explosion() -> None:
    loss, norms = _growing_episodes()
    norms[180] *= 1e4
    rollout = _with_calls(series_inputs(loss, norms), {0: (10, "[4]")})
    found = exploding_gradients.diagnose(rollout)
    assert [d.step for d in found] == [180] and found[0].severity == "error"


def test_the_time_between_the_policys_calls_is_put_down_to_the_episode() -> None:
    run = open_run(Path(__file__).resolve().parent.parent / "fixtures/runs/healthy_rl_episodes")
    (found,) = unattributed_time.diagnose(Inputs.of_saved(run, Config()))
    assert found.fix[0].startswith("each step calls the model on one observation"), found.fix
    assert "gymnasium.vector" in found.fix[0]
