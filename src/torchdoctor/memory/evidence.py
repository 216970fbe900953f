"""The numbers of an out-of-memory failure, as one typed record.

`memory.oom.capture` fills it while the failed step's tensors are still alive;
`diagnose.oom.from_evidence` turns it into the diagnosis, and `memory.estimate` reads its
Breakdown and Situation to rank the fixes. `to_json()` is the form kept in the diagnosis's
evidence (and `from_json` reads it back from a saved run).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor._json import field_values
from torchdoctor.memory.census import Sharding
from torchdoctor.memory.estimate import Breakdown, Situation
from torchdoctor.memory.holders import Holder

_OPTIONAL = ("function", "candidates")  # present only when the capture found them


@dataclasses.dataclass
class OomEvidence:
    exception: str  # the exception's class name
    message: str  # the first line of its message
    device: str  # "cuda:0", "cpu", "mps", ...
    breakdown: Breakdown
    situation: Situation
    asked: int | None = None  # bytes the failed allocation asked for
    step: int | None = None
    phase: str | None = None  # setup, data, forward, backward, optimizer, other
    module: str | None = None  # qualified name of the module that asked
    module_type: str | None = None
    location_source: str | None = None  # traceback, autograd_function, traced_backward, ...
    location_note: str | None = None  # how sure the location is
    file: str | None = None
    line: int | None = None
    function: str | None = None  # a custom autograd Function whose backward failed
    candidates: list[str] | None = None  # modules whose forward calls that Function
    message_fields: dict[str, Any] = dataclasses.field(default_factory=dict)  # parsed message
    memory: dict[str, Any] = dataclasses.field(default_factory=dict)  # allocator / host readings
    counts: dict[str, int] = dataclasses.field(default_factory=dict)  # tensors by kind
    tensor_bytes: int = 0
    not_in_tensors: int | None = None  # bytes in use that no live tensor accounts for
    top_tensors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    optimizers: list[str] = dataclasses.field(default_factory=list)
    models: list[list[str]] = dataclasses.field(default_factory=list)  # [label, class name]
    holders: list[Holder] = dataclasses.field(default_factory=list)
    phases: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # last traced step
    modules: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # its forward growth
    traced_step: int | None = None
    snapshot: str | None = None  # the CUDA allocator snapshot file, when one was written
    run_dir: str | None = None
    sharding: Sharding | None = None  # a sharded model's figures

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in _OPTIONAL:
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OomEvidence:
        """The capture from its JSON form, each field read as its annotation says (the
        codec's field_values: the breakdown, the holders...); other keys are dropped."""
        values = field_values(cls, data)
        values["breakdown"] = values["breakdown"] or Breakdown()
        values["situation"] = values["situation"] or Situation()
        absent = {"exception": "", "message": "", "device": values["situation"].device}
        values |= {name: value for name, value in absent.items() if name not in data}
        return cls(**values)
