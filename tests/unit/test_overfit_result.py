"""The overfit mode's result, read back from the file its child process wrote, in one place
(OverfitResult.from_json): a result of this version is written again byte for byte; one that
lacks keys (an older child's) still reads and renders."""

from __future__ import annotations

import json
from typing import Any

from torchdoctor._json import dumps
from torchdoctor.recipes.overfit_result import OverfitResult
from torchdoctor.report.overfit import render_overfit


def _result() -> dict[str, Any]:
    return {
        "steps": 3,
        "limit": 5,
        "series": {
            "loss": [2.0, "nan", 0.5],
            "accuracy": [None, None, None],
            "grad_norm": [1.0, 1.0, 1.0],
            "update_ratio": [None, 1e-6, 1e-6],
        },
        "params": [
            {
                "name": "fc.weight",
                "numel": 4,
                "requires_grad": False,
                "in_optimizer": True,
                "grad_seen": False,
                "grad_nonzero": False,
                "changed": False,
            },
        ],
        "lr": 0.1,
        "optimizer": "SGD",
        "loss_functions": {"mse_loss": 3},
        "reductions": {"mean": 3},
        "label_smoothing": 0.0,
        "findings": [{"kind": "broadcast_target", "input_shape": [4, 1], "target_shape": [4]}],
        "batch": {
            "source": "calls",
            "description": "the tensors passed",
            "tensors": ["[4] f32"],
            "fetches_in_first_step": 0,
            "replayed": 2,
        },
        "no_batch": False,
        "silent": [["grad_not_cleared", {"step": 1}]],
        "kind": "regression",
        "window": 1,
        "first_loss": 2.0,
        "final_loss": 0.5,
        "final_accuracy": None,
        "relative_loss": 0.25,
        "rule": "the loss at most 0.01 x its first value",
        "passed": False,
        "suspects": [
            {
                "kind": "frozen",
                "title": "frozen",
                "params": ["fc.weight"],
                "fix": "unfreeze",
                "evidence": {"count": 1, "elements": 4},
            }
        ],
        "script": {
            "stopped_by_torchdoctor": False,
            "exit_code": 0,
            "exception": None,
            "interrupted": False,
        },
        "run_dir": "/runs/a",
        "diagnoses": [
            {
                "kind": "not_learning",
                "severity": "warning",
                "step": 2,
                "location": None,
                "summary": "flat",
            }
        ],
    }


def test_a_result_is_written_again_as_it_came() -> None:
    data = json.loads(dumps(_result()))
    read = OverfitResult.from_json(data)
    assert dumps(read, indent=2) == json.dumps(data, indent=2)
    assert read.suspects[0].evidence == {"count": 1, "elements": 4}
    assert read.series.loss[1] == "nan" and read.script is not None


def test_an_older_result_without_some_keys_reads_and_renders() -> None:
    data = _result()
    for key in ("silent", "findings", "label_smoothing", "diagnoses", "script", "batch"):
        del data[key]
    del data["series"]["update_ratio"]
    read = OverfitResult.from_json(data)
    assert read.silent == [] and read.script is None and read.series.update_ratio == []
    text = render_overfit(read)
    assert text.startswith("overfit FAILED: the model did not memorise its first batch in 3 steps")
    assert "the script ended by itself after 3 of the 5 steps asked for" in text
    assert "1. frozen" in text and text.endswith("run directory: /runs/a")
