"""zero_gradients: every recorded gradient norm exactly 0 (pytorch/examples' DDP tutorial:
cross_entropy over one output, loss 0 and norm 0 on all 64 steps, where torchdoctor said "no
problems found"); one nonzero norm, too few steps, or missing gradients say nothing."""

from __future__ import annotations

from helpers import series_inputs

from torchdoctor.diagnose import zero_gradients
from torchdoctor.diagnose.zero_gradients import MIN_STEPS


def test_every_gradient_zero_and_a_constant_loss() -> None:
    [found] = zero_gradients.diagnose(series_inputs([0.0] * 12, [0.0] * 12))
    assert found.severity == "error" and found.step == 11
    assert found.evidence.steps == 12 and found.evidence.loss == 0.0
    assert "The loss is 0 on every step" in found.summary
    assert "cross_entropy over a single class" in found.fix[0]


def test_a_loss_that_moves_is_not_called_constant() -> None:
    [found] = zero_gradients.diagnose(
        series_inputs([1.0 - 0.01 * i for i in range(12)], [0.0] * 12)
    )
    assert found.evidence.loss is None and "every step" not in found.summary


def test_what_is_not_zero_gradients() -> None:
    n = MIN_STEPS
    assert zero_gradients.diagnose(series_inputs([0.0] * (n + 2), [0.0] * (n + 1) + [1e-9])) == []
    assert zero_gradients.diagnose(series_inputs([0.0] * (n - 1), [0.0] * (n - 1))) == []
    # no gradient at all (None: a frozen model, a detached loss) is other kinds'
    assert zero_gradients.diagnose(series_inputs([0.0] * (n + 2), [None] * (n + 2))) == []
