"""PyTorch/XLA (TPU) errors."""

from __future__ import annotations

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, first, rx

_STATUS = (
    r"\b(INVALID_ARGUMENT|RESOURCE_EXHAUSTED|INTERNAL|UNIMPLEMENTED|FAILED_PRECONDITION"
    r"|DEADLINE_EXCEEDED|UNAVAILABLE)\b"
)


def _xla_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    status = first(_STATUS, message) or first(_STATUS, text)
    if status:
        f["status"] = status
    m = rx(r"Shapes must be equal rank, but are (\d+) and (\d+)").search(message)
    if m:
        f["rank_a"], f["rank_b"] = int(m.group(1)), int(m.group(2))
    m = rx(r"Used ([\d.]+\s*[KMGT]?i?B?) of ([\d.]+\s*[KMGT]?i?B?) hbm").search(text)
    if m:
        f["hbm_used"], f["hbm_total"] = m.group(1), m.group(2)
    return f


XLA_ERROR = Entry(
    code="xla.error",
    title="XLA (TPU) error",
    meaning=(
        "PyTorch/XLA records operations lazily and compiles them into an XLA graph. Errors "
        "appear when the graph is compiled or run, away from the Python line that built the "
        "faulty operation: shape errors that eager mode would report per operation, device "
        "memory (HBM) exhaustion, operations without an XLA lowering."
    ),
    patterns=(
        r"InvalidArgumentError: Shapes must be equal rank",
        r"Shapes must be equal rank, but are \d+ and \d+",
        r"XLA:TPU compile permanent error",
        r"Ran out of memory in memory space hbm",
        r"\bXlaRuntimeError\b",
        r"torch_xla/csrc/.*(?:Check failed|error)",
        r"\bXLA\b.{0,80}(?:error|failed)",
        r"(?:Status|status|Error)\W+(?:RESOURCE_EXHAUSTED|INVALID_ARGUMENT|UNIMPLEMENTED)\b",
    ),
    priority=-1,
    examples=(
        "InvalidArgumentError: Shapes must be equal rank, but are 2 and 3",
        "RuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory "
        "in memory space hbm. Used 17.61G of 15.48G hbm. Exceeded hbm capacity by 2.13G.",
        "RuntimeError: torch_xla/csrc/tensor_methods.cpp:880 : Check failed: xla::ShapeUtil::"
        "Compatible(shape1, shape2)",
    ),
    summary=(
        "XLA ran out of device memory (HBM): {{hbm_used}} needed of {{hbm_total}}.",
        "XLA found tensors of rank {{rank_a}} and {{rank_b}} where equal ranks are needed.",
        "XLA failed with {{status}}.",
        "PyTorch/XLA failed compiling or running the graph.",
    ),
    extract=_xla_fields,
    causes=(
        Cause(
            "hbm",
            "The TPU's HBM is exhausted: batch, sequence length or model too large for the "
            "device, or too many compiled graphs kept alive.",
            weight=0.5,
            signals=(r"RESOURCE_EXHAUSTED|\bhbm\b|out of memory",),
            boost=12,
        ),
        Cause(
            "shapes",
            "Shapes disagree inside the traced graph; XLA reports it at compile time, not at "
            "the Python line that built the operation.",
            weight=0.5,
            signals=(r"Shapes must be|equal rank|ShapeUtil|shape",),
            boost=12,
        ),
        Cause(
            "dynamic_shapes",
            "Dynamic shapes (varying sequence lengths, a smaller last batch, boolean-mask "
            "indexing) make XLA compile new graphs again and again.",
            weight=1.5,
        ),
        Cause(
            "unsupported",
            "An operation without an XLA lowering falls back to the CPU or fails (UNIMPLEMENTED).",
            weight=0.5,
            signals=(r"UNIMPLEMENTED|aten::|lowering",),
            boost=12,
        ),
        Cause("versions", "torch and torch_xla versions that do not match.", weight=0.2),
    ),
    first_steps=(
        "Print the metrics report (import torch_xla.debug.metrics as met; "
        "print(met.metrics_report())): many CompileTime entries mean recompilation, aten:: "
        "counters mean CPU fallbacks, TransferFromDeviceTime means data moving to the host.",
        "Dump the HLO to find the operation: XLA_FLAGS='--xla_dump_to=/tmp/xla_dump "
        "--xla_dump_hlo_as_text' python train.py.",
    ),
    fixes=(
        Fix(
            "Fixed shapes: pad and drop the ragged last batch",
            "padded = pad_sequence(seqs, batch_first=True, padding_value=0)\n"
            "loader = DataLoader(ds, batch_size=32, drop_last=True)",
            ("dynamic_shapes", "shapes"),
        ),
        Fix(
            "Keep shapes static instead of masking",
            "x = torch.where(x > threshold, x, torch.zeros_like(x))  # not x[x > threshold]",
            ("dynamic_shapes", "unsupported"),
        ),
        Fix("Smaller per-device batch", "batch_size //= 2", ("hbm",)),
    ),
)

ENTRIES = (XLA_ERROR,)
