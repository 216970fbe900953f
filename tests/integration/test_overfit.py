"""`torchdoctor overfit` on real buggy training scripts and their fixed versions: a classifier fed
from a DataLoader (a head made after the optimizer over a frozen backbone, a softmax into
CrossEntropyLoss, a learning rate of 1e-7) and a regression that slices its own tensors (a
target that broadcasts against the prediction).

The verb is run end to end (its child process, its JSON, text and exit code) in subprocesses
for a failing and a passing script and for bad targets; the other scripts are judged by the
recipe's training half run in this process (tests/recording.py `recipe`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, script
from recording import Output, recipe, td

CLASSIFIER = script("overfit_classifier.py")
REGRESSION = script("overfit_regression.py")


def _overfit(env: dict[str, str], cwd: Path, steps: int, *target: str) -> tuple[int, Any, str]:
    out = cli(
        "overfit", "--steps", str(steps), "--format", "json", *target, env=env, cwd=cwd, timeout=120
    )
    return out.returncode, json.loads(out.stdout) if out.stdout else None, out.stderr


def _recipe(tmp_path: Path, steps: int, *target: str) -> tuple[Any, Output]:
    r, out = recipe("overfit", steps, *target, cwd=tmp_path)
    assert out.returncode == 0 and r is not None, out.stderr
    return r, out


def _kinds(result: dict[str, Any]) -> list[str]:
    return [s["kind"] for s in result["suspects"]]


def test_fixed_classifier_memorises_its_batch_and_side_effects_happen(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r, out = _recipe(tmp_path, 30, CLASSIFIER)
    assert r["passed"] is True and r["kind"] == "classification" and r["suspects"] == []
    assert r["final_accuracy"] == 1.0 and r["relative_loss"] <= 0.1
    assert len(r["series"]["loss"]) == 30 and r["steps"] == 30
    assert r["batch"]["source"] == "dataloader" and r["batch"]["tensors"][1] == "[16] int64"
    # the script's own logging went on; it was stopped inside its loop, so the checkpoint
    # after the loop was not written
    assert "step 0 loss" in out.stdout and r["script"]["stopped_by_torchdoctor"] is True
    assert "saved" not in out.stdout.splitlines()
    assert r["batch"]["replayed"] >= 29  # every later next() gave the first batch


def test_head_after_optimizer_names_frozen_and_missing_parameters(env, tmp_path) -> None:
    # the verb end to end, failing: its JSON and exit code 1
    code, r, err = _overfit(env, tmp_path, 20, CLASSIFIER, "--bug", "head_after_optimizer")
    assert code == 1, err
    assert r["passed"] is False
    assert _kinds(r)[:2] == ["frozen", "not_in_optimizer"]
    frozen, missing = r["suspects"][:2]
    assert frozen["params"] == ["body.0.weight", "body.0.bias"]
    assert missing["params"] == ["head.weight", "head.bias"]
    assert missing["evidence"]["changed"] == 0
    assert len(set(r["series"]["loss"])) == 1  # nothing moved


@pytest.mark.slow
def test_softmax_into_cross_entropy_and_tiny_lr(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r, _ = _recipe(tmp_path, 40, CLASSIFIER, "--bug", "softmax")
    assert r["passed"] is False
    assert _kinds(r) == ["probabilities_into_cross_entropy"]
    assert r["suspects"][0]["evidence"]["row_sum"] == pytest.approx(1.0)
    r, _ = _recipe(tmp_path, 20, CLASSIFIER, "--bug", "tiny_lr")
    assert r["passed"] is False
    assert _kinds(r) == ["lr_too_small"]
    evidence = r["suspects"][0]["evidence"]
    assert evidence["lr"] == 1e-7 and evidence["median_update_ratio"] < 1e-4
    assert evidence["optimizer"] == "SGD"


def test_regression_broadcast_target_and_its_fix(env, tmp_path) -> None:
    r, _ = _recipe(tmp_path, 60, REGRESSION, "--bug", "broadcast")
    assert r["passed"] is False
    assert r["kind"] == "regression" and r["batch"]["source"] == "calls"
    (suspect,) = r["suspects"]
    assert suspect["kind"] == "broadcast_target"
    assert suspect["evidence"]["input_shape"] == [32, 1]
    assert suspect["evidence"]["target_shape"] == [32]
    # the verb end to end, passing: the text report (verdict, curve), exit code 0
    out = cli("overfit", "--steps", "60", REGRESSION, env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "overfit PASSED" in out.stdout and "loss (log scale)" in out.stdout
    assert "side effects (checkpoints it saves, logs it writes) still happen" in out.stderr
    assert "done" not in out.stdout.splitlines()  # stopped inside the loop


def test_bad_targets(env, tmp_path) -> None:
    # refused before a training process is started: the verb's main() here
    missing = td("overfit", "nothere.py", cwd=tmp_path)
    assert missing.returncode == 2 and "can't open file 'nothere.py'" in missing.stderr
    corrupt = tmp_path / "corrupt.py"
    corrupt.write_bytes(b"\x00\x89PNG\x00")
    out = td("overfit", corrupt, cwd=tmp_path)
    assert out.returncode == 2 and "is not a Python script" in out.stderr
    nostep = tmp_path / "nostep.py"
    nostep.write_text("import torch\nprint('no training here')\n")
    out = cli("overfit", "--format", "json", str(nostep), env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 1
    assert "ended without a training step" in out.stderr
    assert json.loads(out.stdout)["passed"] is False
