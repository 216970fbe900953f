"""Parts of evidence that several kinds share, as records (_json.Record: written to the
finding's JSON and read back as these classes). A part one kind alone has sits in its module;
a captured stack's frames and threads are frames.StackFrame and frames.ThreadStack."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor._json import Record, optional


@dataclasses.dataclass(kw_only=True)
class CollectiveCall(Record):
    """A collective call as a finding shows it; the optional fields where the finding has
    them (a pending call's group and number, how long it has been waited for)."""

    group: str | None = optional()
    seq: int | None = optional()
    op: str
    shapes: Any = None  # the tensors' shapes: parsed JSON, or the text as recorded
    dtype: str | None = None
    site: str | None = None  # file:line of the user's code that issued it
    step: int | None = None
    state: str | None = optional()  # issued, completed or failed
    waited: float | None = optional()  # seconds a rank has waited in it
