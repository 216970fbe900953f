"""The module tree of one step with its shapes, as `torchdoctor shapes` prints it."""

from __future__ import annotations

from typing import Any

from torchdoctor.telemetry.shapes import StepShapes

MAX_CELL = 44


def _cell(text: Any) -> str:
    text = "-" if text in (None, "") else str(text)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 3] + "..."


def _unique(text: Any) -> str:
    """'float32, float32' -> 'float32'."""
    if not text:
        return "-"
    parts = list(dict.fromkeys(p.strip() for p in str(text).split(",")))
    return ", ".join(parts)


def render_shapes(data: StepShapes) -> str:
    calls = data.calls
    rows = [("module (type)", "input shapes", "output shapes", "dtype", "device", "params")]
    for call in calls:
        indent = "  " * call.depth
        name = call.module.rsplit(".", 1)[-1] if call.depth else call.module
        output = "raised" if call.raised else call.output_shapes
        dtype = _unique(call.output_dtypes or call.input_dtypes)
        device = _unique(call.output_devices or call.input_devices)
        count = f"{call.params.params:,}" if call.params and call.params.params else "-"
        rows.append(
            (
                f"{indent}{name} ({call.type})",
                _cell(call.input_shapes),
                _cell(output),
                dtype,
                device,
                count,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    out = [f"step {data.step}, rank {data.rank}: {len(calls)} module calls"]
    for i, row in enumerate(rows):
        cells = [row[c].ljust(widths[c]) for c in range(5)] + [row[5].rjust(widths[5])]
        out.append("  ".join(cells).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    seen = set()
    for root in calls:
        p = root.params
        if root.depth != 0 or p is None or root.module in seen:
            continue
        seen.add(root.module)
        out.append(f"{root.module}: {p.params:,} parameters, {p.trainable:,} trainable")
    others = [str(s) for s in data.steps if s != data.step]
    if others:
        out.append(f"other steps with shapes: {', '.join(others[-10:])} (--step N)")
    return "\n".join(out)
