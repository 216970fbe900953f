"""The `recompilation` and `graph_break` diagnoses over python.compile rows: thresholds,
grouping by Dynamo frame, and what each guard or reason says to do."""

from __future__ import annotations

import time
from typing import Any

from torchdoctor.diagnose import graph_break, recompilation
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.store.columns import Block
from torchdoctor.store.schema import COMPILE, STEPS


def _steps(n: int) -> Block:
    """n rows of python.steps (steps 0..n-1); only `step` matters here."""
    types = {"int": 0, "float": 0.0, "bool": False, "str": ""}
    rows = [
        tuple(i if c.name == "step" else types[c.type] for c in STEPS.columns) for i in range(n)
    ]
    return Block.from_rows(STEPS, rows)


def _inputs(rows: list[dict[str, Any]], steps: int = 0, age: float = 10.0) -> Inputs:
    names = COMPILE.column_names
    base = {n: None for n in names} | {"time": time.time() - age, "rank": 0, "count": 1}
    block = Block.from_rows(COMPILE, [tuple((base | r)[n] for n in names) for r in rows])
    return Inputs(_steps(steps), Block.empty(STEPS), [], None, time.time(), compile=block)


def _recompiles(n: int, guard: str, frame: int = 0, **extra: Any) -> list[dict[str, Any]]:
    rows = [{"kind": "compile", "compile_id": f"{frame}/0", "function": "fwd", "code": "m.py:3"}]
    for i in range(1, n + 1):
        rows.append(
            {
                "kind": "recompile",
                "compile_id": f"{frame}/{i}",
                "function": "fwd",
                "code": "m.py:3",
                "location": "train.py:40",
                "reason": f"{frame}/{i - 1}: " + guard.format(a=30 + i, b=30 + i + 1),
                "step": i,
                "duration": 0.5,
                **extra,
            }
        )
    return rows


def test_recompilation_thresholds() -> None:
    guard = "tensor 'L['x']' size mismatch at index 0. expected {a}, actual {b}"
    assert recompilation.diagnose(_inputs(_recompiles(1, guard))) == []
    (d,) = recompilation.diagnose(_inputs(_recompiles(2, guard)))
    assert d.severity == "info" and d.location == "train.py:40"
    (d,) = recompilation.diagnose(_inputs(_recompiles(5, guard)))
    assert d.severity == "warning" and "fwd() 5 times" in d.summary
    assert "the batch size (dimension 0 of x)" in d.summary
    assert d.evidence.values[:3] == ["31", "32", "33"] and d.evidence.compile_seconds == 2.5
    assert d.fix[0].startswith("torch._dynamo.mark_dynamic(x, 0)")
    limit = {"kind": "recompile_limit", "compile_id": "0/8", "reason": "0/7: " + guard}
    (d,) = recompilation.diagnose(_inputs([*_recompiles(7, guard), limit]))
    assert d.severity == "error" and d.evidence.limit_hit and "runs uncompiled" in d.summary


def test_recompilations_are_counted_per_function() -> None:
    guard = "L['n'] == {a}"
    rows = _recompiles(2, guard, frame=0) + _recompiles(2, guard, frame=1)
    found = recompilation.diagnose(_inputs(rows))
    assert len(found) == 2 and all(d.severity == "info" for d in found)
    assert "pass n as a tensor" in found[0].fix[0]


def test_what_changes() -> None:
    cases = {
        "tensor 'L['ids']' size mismatch at index 1. expected 128, actual 97": "dimension 1",
        "___check_obj_id(L['fn'], 140)": "identity of an object",
        "len(L['xs']) == 3": "length of a list",
        "L['self'].training == True": "train() / eval()",
        "tensor 'L['x']' dtype mismatch. expected Float, actual Half": "dtype",
    }
    for guard, said in cases.items():
        assert said in recompilation.what_changes(guard)[0], guard


def test_graph_breaks_by_place() -> None:
    rows = [
        {
            "kind": "graph_break",
            "location": "train.py:12",
            "function": "step",
            "step": s,
            "reason": "Unsupported Tensor.item() call with capture_scalar_outputs=False",
        }
        for s in range(3)
    ] + [
        {
            "kind": "graph_break",
            "location": "train.py:12",
            "function": "step",
            "reason": "Failed to trace builtin operator",
            "detail": "Hint: use logging",
        },
        {
            "kind": "graph_break",
            "location": "model.py:7",
            "function": "forward",
            "reason": "Data-dependent branching",
        },
        {
            "kind": "graph_break",
            "location": "model.py:9",
            "function": "forward",
            "reason": "Call to `torch._dynamo.graph_break()`",
            "detail": "explicit graph break",
        },
    ]
    found = graph_break.diagnose(_inputs(rows))
    assert [d.location for d in found] == ["train.py:12", "model.py:7", "model.py:9"]
    first = found[0]
    assert first.severity == "warning" and first.evidence.count == 4
    assert ".item()" in first.summary and "print or logging" in first.summary
    assert "use logging" in first.fix
    assert "torch.where" in found[1].fix[0]
    assert found[2].severity == "info"
    assert graph_break.diagnose(_inputs([])) == []


def test_a_graph_break_is_reported_once_its_step_is_over() -> None:
    rows = [{"kind": "graph_break", "location": "t.py:3", "reason": "x", "step": 4}]
    assert graph_break.diagnose(_inputs(rows, steps=4, age=0)) == []  # step 4 still running
    assert len(graph_break.diagnose(_inputs(rows, steps=5, age=0))) == 1
    assert len(graph_break.diagnose(_inputs(rows, steps=0, age=10))) == 1  # quiet for long
