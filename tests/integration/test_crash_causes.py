"""A crash's first fix chosen by what the process knew, not by the words of the error alone:
`element 0 of tensors does not require grad` has four common causes, and the step's own
forward tells them apart (grad on or off, which parameters train). Recorded in-process."""

from __future__ import annotations

from pathlib import Path

import helpers
import pytest
from recording import record

# why the loss has no grad_fn -> words of the first fix of the crash diagnosis
CASES = {
    "detached": "Keep the prediction a tensor",
    "no_grad": "Take the training out of `with torch.no_grad():` at ",
    "no_grad_loop": "Take the training out of `with torch.no_grad():` at ",
    "frozen": "Unfreeze",
    "partly_frozen": "Unfreeze",
}


@pytest.mark.parametrize("how", sorted(CASES))
def test_the_first_fix_is_the_cause_the_step_showed(how: str, tmp_path: Path) -> None:
    recorded = record("crash_no_grad_fn.py", how, run_dir=tmp_path / "run")
    assert recorded.code == 1
    crash = [d for d in recorded.diagnoses() if d["kind"] == "crash"]
    assert crash, recorded.diagnoses()
    first = crash[-1]["fix"].splitlines()[0]
    assert CASES[how] in first, crash[-1]["fix"]
    assert "checkpoint" not in first.lower()
    if how.startswith("no_grad"):  # the block that switched grad off, found in the source:
        # around a frame of the traceback, or above the failing backward() in its function
        after = "no_grad_loop" if how == "no_grad_loop" else "def train"
        line = helpers.line_of("crash_no_grad_fn.py", "with torch.no_grad():", after=after)
        assert f"crash_no_grad_fn.py:{line}: " in first, first
    if how == "partly_frozen":  # the frozen part named, the graph cut still a cause after it
        causes = crash[-1]["evidence"]["causes"]
        assert causes[0].endswith(": discriminator frozen while the rest trains."), causes
        assert "Keep the prediction a tensor" in crash[-1]["fix"], crash[-1]["fix"]


@pytest.mark.parametrize(
    ("args", "first"),
    [
        (("high", "probs"), "Lower the learning rate"),  # the run diverged: its NaN met BCE
        (("fine", "logits"), "Give logits to BCEWithLogitsLoss"),  # raw outputs from step 0
    ],
)
def test_bce_out_of_range_after_a_divergence_is_the_learning_rate(
    args: tuple[str, str], first: str, tmp_path: Path
) -> None:
    recorded = record("crash_bce_diverged.py", *args, run_dir=tmp_path / "run")
    assert recorded.code == 1
    crash = [d for d in recorded.diagnoses() if d["kind"] == "crash"]
    assert crash, recorded.diagnoses()
    assert crash[-1]["fix"].splitlines()[0].startswith(first), crash[-1]["fix"]
    if args[0] == "high":  # the line to change: where the script makes its optimizer
        assert "is made, at " in crash[-1]["summary"], crash[-1]["summary"]
        assert crash[-1]["summary"].endswith("crash_bce_diverged.py:17."), crash[-1]["summary"]


def test_a_device_assert_in_a_model_with_embeddings_names_the_embedding(tmp_path: Path) -> None:
    recorded = record("crash_device_assert_text.py", run_dir=tmp_path / "run")
    assert recorded.code == 1
    (crash,) = [d for d in recorded.diagnoses() if d["kind"] == "crash"]
    ev = crash["evidence"]
    assert ev["category"] == "cuda.device_assert"
    assert "embedding" in ev["causes"][0], ev["causes"]  # not the class labels, the default
    assert "Keep ids inside the embedding" in crash["fix"].splitlines()[0], crash["fix"]


@pytest.mark.parametrize(
    ("output", "first"),
    [
        ("probs", "Lower the learning rate: the run diverged to NaN"),  # a sigmoid feeds BCE: NaN
        ("logits", "Give BCE raw logits"),  # nothing bounds BCE's input
    ],
)
def test_a_device_assert_under_bce_is_told_by_what_fed_it(
    output: str, first: str, tmp_path: Path
) -> None:
    recorded = record("crash_device_assert_bce.py", output, run_dir=tmp_path / "run")
    assert recorded.code == 1
    (crash,) = [d for d in recorded.diagnoses() if d["kind"] == "crash"]
    assert crash["evidence"]["category"] == "cuda.device_assert"
    assert crash["fix"].splitlines()[0].startswith(first), crash["fix"]
    if output == "probs":  # the line to change, with a tenth of its rate
        assert crash["summary"].endswith("crash_device_assert_bce.py:22."), crash["summary"]
        assert "lr=0.0001)" in crash["fix"], crash["fix"]
