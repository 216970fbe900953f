"""Evidence: the numbers behind a finding, one dataclass per diagnosis kind, stored in
python.diagnoses (a JSON text column) and read back through `Record`'s codec (_json.py).

A kind's evidence class sits in the module that makes the finding (`NanEvidence` in
diagnose/nan.py) and is registered with `@kind("nan")`. Field names are the JSON keys, in the
order the JSON shows them; a field made with `optional()` is left out of the JSON while None
(it is written only when the finding has it); its parts are records too (`StackFrame`), read
back as such. `decode` reads rows of any version (see Record), and a kind without a class (a
newer version's) decodes to the base `Evidence` with everything in `extra`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from torchdoctor._json import Record, dumps, optional, trailing

__all__ = ["Evidence", "class_of", "decode", "encode", "kind", "kinds", "optional"]

_KINDS: dict[str, type[Evidence]] = {}
E = TypeVar("E", bound="Evidence")


@dataclasses.dataclass(kw_only=True)
class Evidence(Record):
    KIND: ClassVar[str] = ""
    # A job-level finding's identity (Diagnosis.row writes it), the same finding from any rank.
    job_key: str | None = trailing()

    # What the story (diagnose/story.py) asks of a finding; a kind answers for itself.
    def has_no_cause(self) -> bool:
        """Whether nothing found before can have led here (a bad batch)."""
        return False

    def names_step(self) -> int | None:
        """A later step this finding says something will happen at (non-finite values)."""
        return None


def kind(name: str) -> Callable[[type[E]], type[E]]:
    """Register a kind's evidence class (a class decorator)."""

    def register(cls: type[E]) -> type[E]:
        cls.KIND = name
        _KINDS[name] = cls
        return cls

    return register


def class_of(kind_name: str) -> type[Evidence]:
    """The evidence class of a kind; the base class for a kind this version does not know."""
    if kind_name not in _KINDS:
        from torchdoctor.diagnose import load_modules

        load_modules()  # each module registers its class when imported
    return _KINDS.get(kind_name, Evidence)


def kinds() -> dict[str, type[Evidence]]:
    """Every registered kind and its class."""
    from torchdoctor.diagnose import load_modules

    load_modules()
    return dict(_KINDS)


def encode(evidence: Evidence) -> str:
    """The text stored in python.diagnoses.evidence."""
    return dumps(evidence.to_json())


def decode(kind_name: str, stored: Any) -> Evidence:
    """The evidence of a stored row: its JSON text (or the already parsed object, as a live
    endpoint's rows come). Never raises: text that is not a JSON object is kept in `extra`."""
    data = stored
    if isinstance(stored, (str, bytes)):
        try:
            data = json.loads(stored or "{}")
        except ValueError:
            return Evidence(extra={"text": stored if isinstance(stored, str) else repr(stored)})
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        return Evidence(extra={"value": data})
    try:
        return class_of(kind_name).from_json(data)
    except (TypeError, ValueError):  # a field the class builds from a value of another shape
        return Evidence.from_json(data)
