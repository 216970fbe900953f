"""telemetry.compile_events in this process: what it installs into Dynamo, that remove() undoes
all of it, and the parsing of Dynamo's messages (as Dynamo wrote them on this torch)."""

from __future__ import annotations

import logging

import pytest

from torchdoctor.diagnose.recompilation import normalise
from torchdoctor.store.tables import Tables
from torchdoctor.telemetry.compile_events import (
    _GRAPH_BREAK_LOGGERS,
    _METRICS_LOGGER,
    install,
    parse_graph_break,
)

# A message of the graph_breaks logger of torch 2.13, abridged.
MESSAGE = """Graph break in user code at /home/u/train.py:42
Graph Break Reason: Encountered graph break when attempting to trace CALL: a function call:

Unsupported Tensor.item() call with capture_scalar_outputs=False
  Explanation: Dynamo does not support tracing `Tensor.item()` (capture_scalar_outputs=False).
  Hint: Set `torch._dynamo.config.capture_scalar_outputs = True` to include these operations.

  Developer debug context: call_method TensorVariable() item () {}

 For more details about this graph break, please visit: https://meta-pytorch.github.io/compile-graph-break-site/gb/gb0124.html

User code traceback:
  File "/home/u/train.py", line 42, in step
    print(loss.item())
"""


def test_parse_graph_break() -> None:
    got = parse_graph_break(MESSAGE)
    assert got["location"] == "/home/u/train.py:42"
    assert got["reason"] == "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert got["detail"] is not None
    assert got["detail"].splitlines()[0].startswith("Explanation: Dynamo does not support")
    assert got["detail"].endswith("gb0124")
    skipped = MESSAGE.replace(
        "Encountered graph break when attempting to trace CALL: a function call:",
        "Failed to handle graph break gracefully. Skipping the function and falling back to "
        "eager. Graph break encountered:",
    )
    assert "runs uncompiled" in (parse_graph_break(skipped)["reason"] or "")


def test_normalise_keeps_the_guard_not_the_values() -> None:
    a = normalise("0/3: tensor 'x' size mismatch at index 0. expected 32, actual 17")
    b = normalise("0/4: tensor 'x' size mismatch at index 0. expected 17, actual 9")
    assert a == b == "tensor 'x' size mismatch at index 0. expected *, actual *"
    assert normalise("1/0: L['n'] == 3   # return x * n  # t.py:3 in f") == "L['n'] == *"


def _state() -> dict[str, object]:
    out: dict[str, object] = {}
    for name in (*_GRAPH_BREAK_LOGGERS, _METRICS_LOGGER):
        logger = logging.getLogger(name)
        out[name] = (logger.level, logger.propagate, list(logger.handlers), list(logger.filters))
    return out


def test_install_records_and_remove_undoes_everything() -> None:
    pytest.importorskip("torch")
    import torch._dynamo
    from torch._dynamo.callback import callback_handler

    before = _state()
    starts = list(callback_handler.start_callbacks)
    tables = Tables()
    watch = install(tables, lambda: 7)
    assert watch.attached  # torch._dynamo is imported already: attached at once
    assert _state() != before and len(callback_handler.start_callbacks) == len(starts) + 1

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    compiled = torch.compile(f, backend="eager")
    compiled(torch.ones(3))
    compiled(torch.ones(5, 2))  # another rank of input: a recompilation
    rows = tables["compile"].snapshot().to_records()
    kinds = [r["kind"] for r in rows]
    assert "graph_break" in kinds and "recompile" in kinds and "compile" in kinds
    assert all(r["step"] == 7 for r in rows)
    (brk, *_more) = [r for r in rows if r["kind"] == "graph_break"]
    assert brk["location"].endswith(f"test_compile_events.py:{f.__code__.co_firstlineno + 2}")
    assert brk["function"] == "f"

    watch.remove()
    assert _state() == before and callback_handler.start_callbacks == starts
    n = tables["compile"].snapshot().rows
    torch._dynamo.reset()
    compiled(torch.ones(3))
    assert tables["compile"].snapshot().rows == n  # nothing recorded once removed
    # Leave the process as it was for the next test here: nothing compiled (a probe started
    # later in this process would otherwise see Dynamo in use and keep module tracing off).
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._dynamo.reset()
