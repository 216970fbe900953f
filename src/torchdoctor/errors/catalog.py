"""The error catalog: one entry per category, stable codes, grouped in one module per family.

An entry says how to recognise its error (patterns over the message), what to pull out of the
message (fields), and what to tell the user: what it means, the likely causes, first steps and
fixes. Causes carry signals: regular expressions over the whole text and tests over the fields
that move a cause up when the text gives evidence for it, so the ranking is for *this* message.

Texts may name fields as ``{{name}}``; a text whose fields are not all known is skipped, and an
item given as a tuple of texts uses the first one that can be filled. Pure data, no torch.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

Fields = dict[str, Any]
Text = str | tuple[str, ...]

# The families, in the order their entries are tried and documented.
FAMILIES: tuple[str, ...] = (
    "memory",
    "cuda",
    "distributed",
    "launcher",
    "parallel",
    "tensors",
    "shapes",
    "autograd",
    "checkpoint",
    "data",
    "compile",
    "xla",
    "numerics",
    "install",
)

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@functools.lru_cache(maxsize=4096)
def rx(pattern: str) -> re.Pattern[str]:
    """Patterns in the catalog are case-insensitive unless they say otherwise with (?-i:...)."""
    return re.compile(pattern, re.IGNORECASE)


def fill(template: str, fields: Mapping[str, Any]) -> str | None:
    """The template with its ``{{name}}`` placeholders filled, or None if one is unknown."""
    missing = False

    def sub(m: re.Match[str]) -> str:
        nonlocal missing
        value = fields.get(m.group(1))
        if value is None or value == "":
            missing = True
            return ""
        return str(value)

    out = _PLACEHOLDER.sub(sub, template)
    return None if missing else out


def pick(text: Text, fields: Mapping[str, Any]) -> str | None:
    """The first of the texts whose placeholders are all known."""
    for template in (text,) if isinstance(text, str) else text:
        out = fill(template, fields)
        if out is not None:
            return out
    return None


def placeholders(text: Text) -> set[str]:
    templates = (text,) if isinstance(text, str) else text
    return {name for t in templates for name in _PLACEHOLDER.findall(t)}


@dataclass(frozen=True)
class Cause:
    """A likely cause. `weight` orders causes when the text says nothing; a signal found in
    the text, or `when` holding for the fields, adds `boost`. `evidence` is what to say
    instead of `text` when `when` holds (it names the culprit); with `only_when` the cause is
    left out when `when` is known to be false. `when` may return None for "cannot tell"."""

    key: str
    text: Text
    weight: float = 1.0
    signals: tuple[str, ...] = ()
    when: Callable[[Fields], bool | None] | None = None
    boost: float = 10.0
    evidence: Text = ()
    only_when: bool = False

    def holds(self, fields: Fields) -> bool | None:
        if self.when is None:
            return None
        try:
            result = self.when(fields)
        except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError):
            return None
        return None if result is None else bool(result)

    def score(self, text: str, fields: Fields) -> float:
        score = self.weight
        if any(rx(pattern).search(text) for pattern in self.signals):
            score += self.boost
        if self.holds(fields):
            score += self.boost
        return score

    def render(self, fields: Fields, ruled_in: bool = False) -> str | None:
        """What to say about this cause for these fields, or None to leave it out. A cause the
        machine rules in (`ruled_in`) is said even where the text's fields leave it out."""
        holds = self.holds(fields)
        if self.only_when and holds is False and not ruled_in:
            return None
        if holds and self.evidence:
            said = pick(self.evidence, fields)
            if said is not None:
                return said
        return pick(self.text, fields)


# The first words of every fix that lowers the learning rate: errors/located.py writes the
# first of them, when it ranks first, on the script's own line that makes the optimizer.
LOWER_LR = "Lower the learning rate"


@dataclass(frozen=True)
class Fix:
    """A remedy with a short piece of code; it ranks with the best-ranked of its causes.
    `needs` names the facts that decide whether the fix applies; when the text states none of
    them, `check` says what to look at before applying it."""

    title: Text
    code: Text
    causes: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    check: Text = ()

    def check_for(self, fields: Fields) -> str | None:
        """What to check before applying the fix, when none of the facts it needs is known.
        A need is a field's name, or `name.item` for an item of a list field (the text
        mentions gradient checkpointing: `mentions.checkpointing`)."""
        if not self.needs or any(_known(fields, name) for name in self.needs):
            return None
        return pick(self.check, fields) if self.check else None


def _known(fields: Fields, need: str) -> bool:
    name, _, item = need.partition(".")
    value = fields.get(name)
    if item:
        return isinstance(value, (list, tuple, set, dict)) and item in value
    return value not in (None, "", [], ())


@dataclass(frozen=True)
class Entry:
    """One category of error."""

    code: str
    title: str
    meaning: str
    patterns: tuple[str, ...]
    examples: tuple[str, ...]
    causes: tuple[Cause, ...]
    first_steps: tuple[Text, ...]
    fixes: tuple[Fix, ...]
    summary: tuple[str, ...] = ()
    extract: Callable[[str, str], Fields] | None = None
    guard: Callable[[str], bool] | None = None
    priority: int = 0
    secondary: bool = False
    exceptions: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    # Patterns in the lines just before the error (its traceback) that make a key-noun match
    # certain: the loader that raised it, the API that was called.
    confirm: tuple[str, ...] = ()
    family: str = field(default="", compare=False)

    def search(self, message: str) -> re.Match[str] | None:
        """The first pattern found in the message, if the guard agrees."""
        for pattern in self.patterns:
            m = rx(pattern).search(message)
            if m is not None:
                if self.guard is not None and not self.guard(message):
                    return None
                return m
        return None

    def search_keys(self, message: str) -> re.Match[str] | None:
        """The family's key nouns (what stays when the wording changes: the operator, the API,
        the exception class): a match is a likely category, said with less confidence."""
        for pattern in self.keys:
            m = rx(pattern).search(message)
            if m is not None:
                if self.guard is not None and not self.guard(message):
                    return None
                return m
        return None

    def fields_for(self, message: str, text: str) -> Fields:
        if self.extract is None:
            return {}
        try:
            return self.extract(message, text)
        except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError):
            return {}

    def ranked_causes(self, text: str, fields: Fields) -> list[Cause]:
        scored = [(c.score(text, fields), -i, c) for i, c in enumerate(self.causes)]
        scored.sort(key=lambda t: (t[0], t[1]), reverse=True)
        return [c for _s, _i, c in scored]


def first(pattern: str, text: str, group: int = 1) -> str | None:
    """The group of the first match of a catalog pattern, or None."""
    m = rx(pattern).search(text)
    return m.group(group) if m else None


def all_of(pattern: str, text: str) -> list[re.Match[str]]:
    return list(rx(pattern).finditer(text))


@functools.cache
def entries() -> tuple[Entry, ...]:
    """Every entry of every family, in family order."""
    out: list[Entry] = []
    for family in FAMILIES:
        module = importlib.import_module(f"torchdoctor.errors.{family}")
        for entry in module.ENTRIES:
            out.append(_with_family(entry, family))
    codes = [e.code for e in out]
    duplicates = {c for c in codes if codes.count(c) > 1}
    if duplicates:
        raise RuntimeError(f"duplicate error codes in the catalog: {sorted(duplicates)}")
    return tuple(out)


def _with_family(entry: Entry, family: str) -> Entry:
    return entry if entry.family == family else replace(entry, family=family)


def by_code(code: str) -> Entry | None:
    for entry in entries():
        if entry.code == code:
            return entry
    return None


def codes() -> Sequence[str]:
    return [e.code for e in entries()]
