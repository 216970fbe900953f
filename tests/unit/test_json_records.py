"""The one JSON encoder writes a record (a dataclass) as the object of its fields in order, or
as its own to_json() where it has one, nested records and non-finite floats included."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from torchdoctor._json import clean, dumps


@dataclasses.dataclass(frozen=True)
class Inner:
    b: float
    a: int


@dataclasses.dataclass(frozen=True)
class Outer:
    z: str
    inner: Inner
    items: list[Inner]


@dataclasses.dataclass(frozen=True)
class OwnForm:
    x: float | None

    def to_json(self) -> dict[str, Any]:
        return {} if self.x is None else {"x": self.x}


def test_a_record_is_its_fields_in_order() -> None:
    value = Outer("z", Inner(1.5, 2), [Inner(0.5, 1)])
    assert dumps(value) == '{"z": "z", "inner": {"b": 1.5, "a": 2}, "items": [{"b": 0.5, "a": 1}]}'


def test_non_finite_floats_inside_a_record_become_text() -> None:
    text = dumps(Outer("z", Inner(float("nan"), 1), [Inner(float("inf"), 2)]))
    assert json.loads(text)["inner"]["b"] == "nan"
    assert json.loads(text)["items"][0]["b"] == "inf"
    assert clean(Inner(float("-inf"), 3)) == {"b": "-inf", "a": 3}


def test_a_record_with_its_own_form_is_written_in_it() -> None:
    assert dumps([OwnForm(None), OwnForm(3)]) == '[{}, {"x": 3}]'
    assert dumps({"k": OwnForm(float("nan"))}) == '{"k": {"x": "nan"}}'
