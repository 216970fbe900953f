"""`crash`: the script died of an exception (other than out-of-memory, which is `oom`).

Event-driven, like `oom`: when the exception ends the script, the capture
(torchdoctor.telemetry.crash) reads the live traceback (the module that raised, by its
qualified name; the step and phase; the shapes that flowed into it in that step) and explains
the error with the catalog of `torchdoctor explain`; `from_evidence` (pure) turns that into
the diagnosis. The periodic pass has nothing to add.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis, fix_with_code
from torchdoctor.failure import SourceLine, TensorInput
from torchdoctor.views import ModuleCall

FLOW_CALLS = 8  # module calls shown before the one that raised


@kind("crash")
@dataclasses.dataclass(kw_only=True)
class CrashEvidence(Evidence):
    exception: str  # class name
    message: str  # the exception's message, first lines
    category: str | None  # the explain catalog's code (shape.matmul), None if not recognised
    title: str
    explanation: str  # the explanation's summary, made specific to this run
    step: int | None = None  # the step in progress
    phase: str | None = None  # setup, data, forward, backward, optimizer, other
    module: str | None = None  # qualified name of the module that raised
    module_type: str | None = None
    location_source: str | None = None  # traceback, script_line, ...
    file: str | None = None  # the user's line (or the module's code) that failed
    line: int | None = None
    definition: SourceLine | None = None  # where the model's code builds that module
    inputs: list[TensorInput] = dataclasses.field(default_factory=list)  # what it received
    flow: list[ModuleCall] = dataclasses.field(default_factory=list)  # calls before it
    flow_step: int | None = None  # the step the flow was recorded in
    flow_live: bool = False  # the flow is from the step that crashed (else an earlier one)
    causes: list[str] = dataclasses.field(default_factory=list)
    fixes: list[dict[str, str]] = dataclasses.field(default_factory=list)
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    return []


def from_evidence(evidence: CrashEvidence) -> Diagnosis:
    e = evidence
    where = ""
    if e.module:
        kind = f" ({e.module_type})" if e.module_type and e.module_type != e.module else ""
        where = f" in the {e.phase} of {e.module}{kind}" if e.phase else f" in {e.module}{kind}"
    elif e.phase and e.phase != "other":
        where = f" in the {e.phase} phase"
    when = f" at step {e.step}" if e.step is not None else ""
    said = f"{e.exception}: {e.message.splitlines()[0] if e.message else ''}".strip()
    summary = f"The script crashed{where}{when}: {_cut(said, 300)}"
    if e.category:
        summary += f" [{e.category}] {e.explanation}"
    location = e.module or (f"{e.file}:{e.line}" if e.file else None)
    fixes = [_fix_line(f) for f in e.fixes]
    if not fixes:
        fixes = ["`torchdoctor explain` on the saved output gives first steps for this error"]
    return Diagnosis(
        kind="crash",
        severity="error",
        summary=summary,
        location=location,
        step=e.step,
        evidence=e,
        fix=fixes,
    )


def flow_window(flow: list[ModuleCall], module: str | None) -> list[ModuleCall]:
    """The calls to show: the leaf module calls before the one that raised (the last
    FLOW_CALLS of them) and that call itself."""
    end = len(flow)
    for i in range(len(flow) - 1, -1, -1):
        if flow[i].raised or (module is not None and flow[i].module == module):
            end = i
            break
    shown = []
    for i, call in enumerate(flow[:end]):
        nxt = flow[i + 1] if i + 1 < len(flow) else None
        leaf = nxt is None or int(nxt.depth or 0) <= int(call.depth or 0)
        if leaf:
            shown.append(call)
    out = shown[-FLOW_CALLS:]
    if end < len(flow):
        out.append(flow[end])
    return out


def _fix_line(fix: dict[str, str]) -> str:
    return fix_with_code(fix["title"], fix.get("code", ""))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
