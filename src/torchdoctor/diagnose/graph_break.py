"""`graph_break`: torch.compile could not trace through a line of a compiled function. Dynamo
splits the function there: the part before is one graph, the line runs in Python, the rest is
compiled as another graph, at every call. Breaks in a training step cost speed (no fusion
across the break, a Python round trip, often a host-device sync) and are usually one line's
fault: a print, a `.item()`, a Python `if` on a tensor's value, a call Dynamo does not support.

One diagnosis per place (the user's file:line), the most frequent first, with the reason
Dynamo gives and the fix for that kind of break. Warning; info for an explicit
`torch._dynamo.graph_break()`.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.recompilation import records
from torchdoctor.diagnose.record import Diagnosis

MAX_PLACES = 5
# A break's compilation may go on after it (the rest of the function is compiled when first
# run, and may break again): a place is reported once the step it happened in is over, or
# once nothing new came for SETTLE seconds, so that one report holds all its reasons.
SETTLE = 2.0
EXPLAIN = (
    "torch._dynamo.explain(fn)(*args) lists every break of a function; "
    "TORCH_LOGS=graph_breaks prints them as they happen"
)

# (words in Dynamo's reason, what it is, fixes)
_KINDS: tuple[tuple[tuple[str, ...], str, tuple[str, ...]], ...] = (
    (
        ("item()", "capture_scalar_outputs", "tolist", "scalar output"),
        "a tensor turned into a Python number (.item(), float(t), .tolist())",
        (
            "keep it a tensor inside the compiled function and call .item() outside it "
            "(return the loss, log it after the step, every N steps)",
            "torch._dynamo.config.capture_scalar_outputs = True traces .item() into the graph",
        ),
    ),
    (
        ("`print`", "print", "logging", "logger"),
        "a print or logging call",
        (
            "print or log outside the compiled function: return the value and print it after "
            "the call",
            "torch._dynamo.config.reorderable_logging_functions.add(print) lets Dynamo move the "
            "print to the end of the graph",
        ),
    ),
    (
        ("data-dependent", "data dependent", "jump", "branch", "dynamic control flow"),
        "a Python `if` or loop on a tensor's value",
        (
            "compute both sides and pick with torch.where(cond, a, b), or use torch.cond",
            "or move the decision outside the compiled function",
        ),
    ),
    (
        ("numpy", "np."),
        "a NumPy call on a tensor",
        ("use the torch equivalent, so the operation stays in the graph",),
    ),
    (
        ("graph_break()", "explicit graph break", "torch._dynamo.graph_break"),
        "an explicit torch._dynamo.graph_break()",
        ("remove the graph_break() call if it is no longer needed",),
    ),
)


@kind("graph_break")
@dataclasses.dataclass(kw_only=True)
class GraphBreakEvidence(Evidence):
    reasons: dict[str, int]  # Dynamo's reason -> how many breaks gave it
    details: dict[str, str]  # reason -> its first break's detail
    function: str | None = None
    code: str | None = None  # the source line of the function's break
    count: int
    places_with_breaks: int
    compile_ids: list[str]


def classify(reason: str) -> tuple[str, list[str]]:
    low = reason.lower()
    for words, what, fixes in _KINDS:
        if any(w.lower() in low for w in words):
            return what, list(fixes)
    return (
        "a call Dynamo cannot trace",
        [
            "wrap the helper in @torch.compiler.disable if it need not be compiled, or "
            "replace it with torch operations",
        ],
    )


def _settled(group: list[dict[str, Any]], inputs: Inputs) -> bool:
    last_step = int(inputs.column("step")[-1]) if inputs.steps.rows else None
    steps = [r["step"] for r in group]
    if last_step is not None and all(s is not None and s <= last_step for s in steps):
        return True
    return inputs.now - max(r["time"] for r in group) >= SETTLE


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    # A break with no line of the user's is inside torch's own code (DDP's and FSDP's forward
    # break on purpose under compile) or another library's: nothing the user can change.
    rows = [row for row in records(inputs, "graph_break") if row["location"]]
    places: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        places[row["location"]].append(row)
    ranked = sorted(
        ((p, g) for p, g in places.items() if _settled(g, inputs)), key=lambda kv: -len(kv[1])
    )
    return [_diagnosis(place, group, len(places)) for place, group in ranked[:MAX_PLACES]]


def _diagnosis(place: str, group: list[dict[str, Any]], total_places: int) -> Diagnosis:
    reasons: collections.Counter[str] = collections.Counter()
    details: dict[str, str] = {}
    for row in group:
        reason = row["reason"] or "no reason given"
        reasons[reason] += 1
        details.setdefault(reason, row["detail"] or "")
    whats: list[str] = []
    fixes: list[str] = []
    hints: list[str] = []
    for reason, _n in reasons.most_common():
        what, kind_fixes = classify(f"{reason}\n{details[reason]}")
        if what not in whats:
            whats.append(what)
            fixes += [f for f in kind_fixes if f not in fixes]
        hints += [
            line.removeprefix("Hint:").strip()
            for line in details[reason].splitlines()
            if line.startswith("Hint:") and line.removeprefix("Hint:").strip() not in hints
        ]
    # The catch-all applies only when nothing more precise was found at this place.
    if len(whats) > 1 and whats[-1] == "a call Dynamo cannot trace":
        whats.pop()
    function = next((r["function"] for r in group if r["function"]), None)
    explicit = all(w.startswith("an explicit") for w in whats)
    in_fn = f" in {function}()" if function and not function.startswith("torch_dynamo") else ""
    steps = [r["step"] for r in group if r["step"] is not None]
    said = "; ".join(reasons)
    summary = (
        f"torch.compile breaks the graph{in_fn} at {place}: {' and '.join(whats)} ({said}). "
        "The function runs as separate graphs with Python in between, at every call."
    )
    return Diagnosis(
        kind="graph_break",
        severity="info" if explicit else "warning",
        summary=summary,
        location=place,
        step=steps[-1] if steps else None,
        evidence=GraphBreakEvidence(
            reasons=dict(reasons.most_common()),
            details=details,
            function=function,
            code=group[0]["code"],
            count=len(group),
            places_with_breaks=total_places,
            compile_ids=sorted({r["compile_id"] for r in group if r["compile_id"]})[:10],
        ),
        fix=[*fixes, *hints[:2], EXPLAIN],
        key=f"graph_break:{place}",
    )
