"""`recompilation`: torch.compile compiling the same function again and again. Each
recompilation costs a compile (seconds) and, past `torch._dynamo.config.recompile_limit`
(8), Dynamo gives up and the function runs uncompiled for the rest of the run. The guard that
keeps failing says what changes between calls (a batch size, a sequence length, a Python
number, a new object each call), and so what to do.

Severity: error when the recompile limit was hit; warning from STORM recompilations of one
function; info from NOTE (two graphs, for train/eval or a last partial batch, are normal).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import is_user_file

NOTE = 2
STORM = 4
MAX_VALUES = 20

_SIZE = re.compile(r"tensor '(?P<name>.+?)' size mismatch at index (?P<dim>\d+)")
_VALUES = re.compile(r"expected (?P<expected>[^,\s]+),? actual (?P<actual>\S+)")
_EQUALS = re.compile(r"(?P<name>L\[[^\]]+\](?:\.\w+)*|[\w.]+) == (?P<value>[^\s#]+)")


@kind("recompilation")
@dataclasses.dataclass(kw_only=True)
class RecompilationEvidence(Evidence):
    function: str | None = None
    code: str | None = None
    recompilations: int
    limit_hit: bool
    guard: str
    guards: dict[str, int]  # the failing guard, as normalised -> how often
    values: list[str]  # the values the guard saw change
    compile_seconds: float
    first_step: int | None = None
    last_step: int | None = None
    call_sites: dict[str, int]  # file:line -> recompilations from it


def normalise(reason: str | None) -> str:
    """A guard failure without the values that change from one recompilation to the next, so
    the same guard failing again counts as one: "tensor 'x' size mismatch at index 0.
    expected 8, actual 5" -> "... expected *, actual *"."""
    if not reason:
        return ""
    first = reason.strip().splitlines()[0]
    first = re.sub(r"^\d+/\d+: ", "", first)
    first = re.sub(r"expected (\S+?),? actual (\S+)", "expected *, actual *", first)
    first = re.sub(r"(==|!=|<=|>=|<|>) [^\s#]+", r"\1 *", first)
    first = re.sub(r"\b0x[0-9a-f]+\b|\b\d{6,}\b", "*", first)
    return first.split("  #")[0].strip()


def frame_id(compile_id: str | None) -> str | None:
    """Dynamo's frame id in a compile id ("3/2" -> "3"): the same code object."""
    m = re.search(r"(\d+)/\d+", compile_id or "")
    return m.group(1) if m else None


def records(inputs: Inputs, *kinds: str) -> list[dict[str, Any]]:
    block = inputs.compile
    if block is None or not block.rows:
        return []
    return [r for r in block.to_records() if r["kind"] in kinds]


def _argument(name: str) -> str:
    """L['x'] -> x, args[0] -> args[0] (as Dynamo names the guarded value)."""
    m = re.fullmatch(r"L\['([^']+)'\](.*)", name)
    return f"{m.group(1)}{m.group(2)}" if m else name


def what_changes(guard: str) -> tuple[str, list[str]]:
    """What the failing guard says changes between calls, and the fixes for it."""
    m = _SIZE.search(guard)
    if m is not None:
        arg, dim = _argument(m.group("name")), int(m.group("dim"))
        mark = f"torch._dynamo.mark_dynamic({arg}, {dim}) on the input before calling it"
        if dim == 0:
            return (
                f"the batch size (dimension 0 of {arg})",
                [
                    f"{mark}: one graph for every batch size",
                    "DataLoader(..., drop_last=True) when only the last batch is smaller",
                    "keep torch.compile's dynamic=None (the default; not dynamic=False) so that "
                    "automatic dynamic shapes take over after one recompilation",
                    "batches of a few fixed sizes (bucket or pad them)",
                ],
            )
        return (
            f"dimension {dim} of {arg} (a sequence length or an image size)",
            [
                "pad or bucket to a few lengths (e.g. multiples of 64): one graph per bucket",
                f"{mark}: one graph for every length",
                "keep torch.compile's dynamic=None (the default; not dynamic=False)",
            ],
        )
    if "stride mismatch" in guard:
        return (
            "the inputs' memory layout (strides)",
            ["make the inputs contiguous before the call: x.contiguous()"],
        )
    if re.search(r"dtype mismatch|device mismatch|requires_grad mismatch", guard):
        return (
            "the inputs' dtype, device or requires_grad",
            [
                "call the compiled function with the same kind of tensors every time (the same "
                "autocast and no_grad state, the same device)",
            ],
        )
    if "training" in guard:
        return (
            "train() / eval() mode",
            ["one graph per mode is expected; compile the evaluation separately if it is big"],
        )
    if "___check_obj_id" in guard or "id(" in guard:
        return (
            "the identity of an object (a new module, function or closure each call)",
            ["create the module or function once, outside the loop, and reuse it"],
        )
    if "___check_type_id" in guard:
        return ("the type of an argument", ["pass arguments of the same type at every call"])
    if "len(" in guard:
        return (
            "the length of a list or tuple argument",
            ["pass a tensor instead of a list whose length changes, or pad the list"],
        )
    m = _EQUALS.search(guard)
    if m is not None:
        arg = _argument(m.group("name"))
        return (
            f"the Python value {arg} (baked into the graph as a constant)",
            [
                f"pass {arg} as a tensor (torch.tensor({arg})) so that a new value does not "
                "compile a new graph",
                "or keep it out of the compiled function",
            ],
        )
    return ("a guarded value", [])


def _values(reasons: list[str]) -> list[str]:
    out: list[str] = []
    for reason in reasons:
        m = _VALUES.search(reason)
        if m is None:
            continue
        for value in (m.group("expected"), m.group("actual")):
            if not out or out[-1] != value:
                out.append(value)
    return out[:MAX_VALUES]


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    rows = records(inputs, "recompile", "recompile_limit")
    by_function: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        # One code object: Dynamo's frame id, else where the function starts.
        frame = frame_id(row["compile_id"])
        by_function[f"frame {frame}" if frame else row["code"] or row["function"] or "?"].append(
            row
        )
    found = []
    for code, group in by_function.items():
        recompiles = [r for r in group if r["kind"] == "recompile"]
        limit = [r for r in group if r["kind"] == "recompile_limit"]
        if not limit and len(recompiles) < NOTE:
            continue
        found.append(_diagnosis(code, recompiles, limit))
    return found


def _name(function: str | None, code: str | None, location: str | None) -> str:
    """How to call the compiled function: its name, unless it is a wrapper of torch's own
    (torch.compile(model) compiles a wrapper named `inner`): then where it is called."""
    if function and code and is_user_file(code):
        return f"{function}()"
    if location:
        return f"the compiled function called at {location}"
    return f"{function}()" if function else "a compiled function"


def _diagnosis(
    group_key: str, recompiles: list[dict[str, Any]], limit: list[dict[str, Any]]
) -> Diagnosis:
    reasons = [r["reason"] for r in recompiles + limit if r["reason"]]
    guards = collections.Counter(normalise(r) for r in reasons)
    guard = guards.most_common(1)[0][0] if guards else ""
    same_guard = [r for r in reasons if normalise(r) == guard]
    changes, fixes = what_changes(guard)
    values = _values(same_guard)
    function = next((r["function"] for r in recompiles + limit if r["function"]), None)
    code = next((r["code"] for r in recompiles + limit if r["code"]), None)
    locations = collections.Counter(r["location"] for r in recompiles + limit if r["location"])
    location = locations.most_common(1)[0][0] if locations else code
    name = _name(function, code, location)
    steps = [r["step"] for r in recompiles + limit if r["step"] is not None]
    seconds = sum(r["duration"] or 0.0 for r in recompiles)
    n = len(recompiles)
    seen = f" ({', '.join(values)})" if values else ""
    if limit:
        severity = "error"
        summary = (
            f"torch.compile recompiled {name} {n} times and hit the recompile limit: it now "
            f"runs uncompiled. What changes at every call: {changes}{seen}."
        )
    else:
        severity = "warning" if n >= STORM else "info"
        summary = (
            f"torch.compile recompiled {name} {n} times ({seconds:.1f} s of compiling): "
            f"{changes} changes between calls{seen}."
        )
    fixes = [*fixes, "TORCH_LOGS=recompiles python train.py prints every guard that fails"]
    return Diagnosis(
        kind="recompilation",
        severity=severity,
        summary=summary,
        location=location,
        step=steps[-1] if steps else None,
        evidence=RecompilationEvidence(
            function=function,
            code=code,
            recompilations=n,
            limit_hit=bool(limit),
            guard=guard,
            guards=dict(guards.most_common(5)),
            values=values,
            compile_seconds=seconds,
            first_step=steps[0] if steps else None,
            last_step=steps[-1] if steps else None,
            call_sites=dict(locations.most_common(3)),
        ),
        fix=fixes,
        key=f"recompilation:{group_key}",
    )
