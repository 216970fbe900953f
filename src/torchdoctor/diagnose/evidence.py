"""Evidence: the numbers behind a finding, one dataclass per diagnosis kind, and the one codec
that stores it in python.diagnoses (a JSON text column) and reads it back.

A kind's evidence class sits in the module that makes the finding (`NanEvidence` in
diagnose/nan.py) and is registered with `@kind("nan")`. Field names are the JSON keys, in the
order the JSON shows them; a field made with `optional()` is left out of the JSON while None
(it is written only when the finding has it). `decode` reads rows of any version: keys this
version does not know are kept in `extra` (shown and written again, after the known ones), a
key a row lacks takes its default (None for a field without one), and a kind without a class
(a newer version's) decodes to the base `Evidence` with everything in `extra`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from torchdoctor._json import dumps

_OMIT = {"omit_none": True}
_KINDS: dict[str, type[Evidence]] = {}
E = TypeVar("E", bound="Evidence")


def optional(default: Any = None) -> Any:
    """A field written to the JSON only when it is not None."""
    return dataclasses.field(default=default, metadata=_OMIT)


@dataclasses.dataclass(kw_only=True)
class Evidence:
    KIND: ClassVar[str] = ""
    # Keys this version does not know (a row written by another version): kept as they came.
    extra: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    # A job-level finding's identity (Diagnosis.row writes it), the same finding from any rank.
    job_key: str | None = dataclasses.field(default=None, repr=False)

    # What the story (diagnose/story.py) asks of a finding; a kind answers for itself.
    def has_no_cause(self) -> bool:
        """Whether nothing found before can have led here (a bad batch)."""
        return False

    def names_step(self) -> int | None:
        """A later step this finding says something will happen at (non-finite values)."""
        return None

    def to_json(self) -> dict[str, Any]:
        """The JSON form: the fields in order, then the unknown keys, then `job_key`."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("extra", "job_key"):
                continue
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            out[f.name] = _plain(value)
        out.update(self.extra)
        if self.job_key is not None:
            out["job_key"] = self.job_key
        return out

    @classmethod
    def from_json(cls: type[E], data: Mapping[str, Any]) -> E:
        """The evidence from its JSON form, tolerant of other versions' rows."""
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
        for key, value in data.items():
            if key in fields:
                values[key] = value
            else:
                extra[str(key)] = value
        for name, f in fields.items():
            missing = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if name not in values and missing:
                values[name] = None  # a key an older row lacks
        return cls(**values, extra=extra)


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


def _plain(value: Any) -> Any:
    if isinstance(value, Evidence):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value
