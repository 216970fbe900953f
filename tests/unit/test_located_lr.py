"""The learning-rate fix written on the script's own line (errors/located.py): the rate in the
constructor's call is replaced by a tenth of the live one, and nothing else that looks like it."""

from __future__ import annotations

import pytest

from torchdoctor.errors.api import explain
from torchdoctor.errors.located import locate_explanation
from torchdoctor.failure import SourceLine


@pytest.mark.parametrize(
    ("code", "lr", "written"),
    [
        ("optimizer = optim.Adam(model.parameters(), lr=0.5)", 0.5, "lr=0.05)"),
        ("opt = SGD(params, lr=1e-3, momentum=0.9)", 1e-3, "lr=0.0001, momentum=0.9)"),
        ("opt = SGD(params, lr=base_lr * 2)", 0.2, "lr=base_lr * 2)  # lower its lr: 10x or more"),
        ("opt = SGD(params, lr=eps)", 0.1, "lr=eps)  # lower its lr: 10x or more"),
    ],
)
def test_the_rate_on_the_line_that_makes_the_optimizer(code: str, lr: float, written: str) -> None:
    text = "RuntimeError: all elements of input should be between 0 and 1"
    diverged = explain(text)
    diverged.fixes.sort(key=lambda f: not f["title"].startswith("Lower the learning rate"))
    made = SourceLine(file="/x/train.py", line=7, code=code)
    place = {"optimizer": {"label": "opt", "type": "SGD", "lr": lr, "definition": made}}
    located = locate_explanation(diverged, place)
    first = located.fixes[0]["code"].splitlines()
    assert first[0] == f"# /x/train.py:7 now: {code}"
    assert first[1].endswith(written), first
    # the catalog's other lines stay: only its stand-in optimizer line is replaced
    assert first[2:] == [
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # before optimizer.step()"
    ]
    assert located.summary.endswith("is set where opt is made, at /x/train.py:7.")
    # no line found: the catalog's fix as it was
    assert locate_explanation(diverged, {}).fixes == diverged.fixes
