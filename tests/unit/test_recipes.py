"""The pure halves of the recipes: the overfit verdict (memorisation rule per loss kind, the
suspects' order) and the repro comparison (where two runs first differ)."""

from __future__ import annotations

import copy
from typing import Any

from torchdoctor.recipes.compare import compare
from torchdoctor.recipes.verdict import judge


def _facts(loss: list[float], name: str, accuracy: list[float | None] | None = None,
           **extra: Any) -> dict[str, Any]:  # fmt: skip
    n = len(loss)
    facts = {
        "steps": n,
        "series": {
            "loss": loss,
            "accuracy": accuracy or [None] * n,
            "update_ratio": [None] + [1e-3] * (n - 1),
        },
        "params": [],
        "loss_functions": {name: n},
        "reductions": {"mean": n},
        "findings": [],
    }
    facts.update(extra)
    return facts


def _param(name: str, **flags: Any) -> dict[str, Any]:
    row = {"name": name, "numel": 4, "requires_grad": True, "in_optimizer": True,
           "grad_seen": True, "grad_nonzero": True, "changed": True}  # fmt: skip
    row.update(flags)
    return row


def test_classification_needs_every_sample_right_and_the_loss_down_tenfold() -> None:
    falling = [2.0 - i * 0.19 for i in range(10)]  # 2.0 -> 0.29: not 10x down
    assert judge(_facts(falling, "cross_entropy", [1.0] * 10))["passed"] is False
    assert judge(_facts([2.0] * 5 + [0.1] * 5, "cross_entropy", [1.0] * 10))["passed"] is True
    one_wrong = judge(_facts([2.0] * 5 + [0.1] * 5, "cross_entropy", [0.9] * 10))
    assert one_wrong["passed"] is False and one_wrong["kind"] == "classification"
    smoothed = _facts([2.0] * 5 + [0.9] * 5, "cross_entropy", [1.0] * 10, label_smoothing=0.1)
    assert judge(smoothed)["passed"] is True  # its loss cannot reach 0


def test_regression_needs_two_orders_of_magnitude() -> None:
    assert judge(_facts([9.0] * 5 + [0.2] * 5, "mse_loss"))["passed"] is False
    result = judge(_facts([9.0] * 5 + [0.05] * 5, "mse_loss"))
    assert result["passed"] is True and result["kind"] == "regression"


def test_suspects_come_in_the_seeds_order_named_by_parameter() -> None:
    params = [
        _param("body.0.weight", requires_grad=False, changed=False),
        _param("head.weight", in_optimizer=False, changed=False),
        _param("aux.weight", grad_seen=False),
        _param("gate.weight", grad_nonzero=False),
    ]
    facts = _facts([2.0] * 10, "cross_entropy", [0.1] * 10, params=params)
    facts["series"]["update_ratio"] = [None] + [1e-6] * 9
    facts["lr"] = 1e-5
    facts["findings"] = [{"kind": "probabilities_into_cross_entropy", "row_sum": 1.0}]
    facts["reductions"] = {"sum": 10}
    result = judge(facts)
    kinds = [s["kind"] for s in result["suspects"]]
    assert kinds == [
        "frozen",
        "not_in_optimizer",
        "no_gradient",
        "zero_gradient",
        "lr_too_small",
        "probabilities_into_cross_entropy",
        "reduction_sum",
    ]
    assert [s["params"] for s in result["suspects"][:4]] == [
        ["body.0.weight"], ["head.weight"], ["aux.weight"], ["gate.weight"]
    ]  # fmt: skip
    assert "try about 0.01" in result["suspects"][4]["fix"]


def _run(loss: float = 1.0) -> dict[str, Any]:
    step = {
        "loss": [loss], "grad_norm": 0.5, "batch": ["b"], "forward_at": 1,
        "params": [["w", "p1"]], "grads": [["w", "g1"]],
        "ops": [["rand", None, "r", "t.py:3"], ["linear", "fc", "o1", "t.py:9"]],
    }  # fmt: skip
    return {"limit": 2, "initial_params": [["w", "i"]], "trace": [step, copy.deepcopy(step)],
            "sources": {}, "str_hash": 1, "module_types": {"fc": "Linear"}}  # fmt: skip


def test_compare_finds_the_first_difference_in_the_order_things_happen() -> None:
    a = _run()
    assert compare(a, _run()).identical is True
    b = _run()
    b["trace"][0]["ops"][0][2] = "other"  # a setup op before the model's call: did not matter
    assert compare(a, b).identical is True
    b = _run()
    b["trace"][1]["ops"][1][2] = "o2"
    b["trace"][1]["loss"] = [1.5]
    first = compare(a, b).first_difference
    assert first is not None
    assert (first.step, first.op, first.module, first.module_type) == (1, "linear", "fc", "Linear")
    b = _run()
    b["trace"][1]["grads"] = [["w", "g2"]]
    first = compare(a, b).first_difference
    assert first is not None and first.what == "gradients" and first.param == "w"
    b = _run()
    b["sources"] = {"numpy": {"seeded": False, "uses": 2, "unseeded_uses": 2,
                              "sites": ["t.py:5"]}}  # fmt: skip
    b["trace"][0]["batch"] = ["c"]
    result = compare(a, b)
    assert result.first_difference is not None and result.first_difference.what == "batch"
    assert result.fix == ["np.random.seed(0)"] and result.sources[0].sites == ["t.py:5"]
