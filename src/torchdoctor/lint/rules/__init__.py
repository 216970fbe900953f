"""The lint rules, one module per family; codes are stable.

TD1xx memory, TD2xx numerics, TD3xx torch.compile, TD4xx the training loop, TD5xx
distributed, TD6xx deprecated APIs, TD7xx checkpoints, TD8xx script configuration.
The engine does not import this package: callers pass `all_rules()` (or a selection) to it.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from types import ModuleType

from torchdoctor.lint.rule import Rule
from torchdoctor.lint.rules import (
    checkpoint,
    compile,
    config,
    deprecated,
    distributed,
    loop,
    memory,
    numerics,
)

_MODULES: dict[str, ModuleType] = {
    "memory": memory,
    "numerics": numerics,
    "compile": compile,
    "loop": loop,
    "distributed": distributed,
    "deprecated": deprecated,
    "checkpoint": checkpoint,
    "config": config,
}
FAMILIES: tuple[str, ...] = tuple(_MODULES)


@functools.cache
def all_rules() -> tuple[Rule, ...]:
    out = [replace(rule, family=family) for family, m in _MODULES.items() for rule in m.RULES]
    codes = [r.code for r in out]
    if len(set(codes)) != len(codes):
        raise RuntimeError("duplicate lint rule codes")
    return tuple(sorted(out, key=lambda r: r.code))


def by_code(code: str) -> Rule | None:
    return next((r for r in all_rules() if r.code == code), None)
