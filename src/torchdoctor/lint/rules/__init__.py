"""The lint rules, one module per family; codes are stable.

TD1xx memory, TD2xx numerics, TD3xx torch.compile, TD4xx the training loop, TD5xx
distributed, TD6xx deprecated APIs, TD7xx checkpoints.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import replace

from torchdoctor.lint.engine import Rule

FAMILIES: tuple[str, ...] = (
    "memory",
    "numerics",
    "compile",
    "loop",
    "distributed",
    "deprecated",
    "checkpoint",
)


@functools.cache
def all_rules() -> tuple[Rule, ...]:
    out: list[Rule] = []
    for family in FAMILIES:
        module = importlib.import_module(f"torchdoctor.lint.rules.{family}")
        out += [replace(rule, family=family) for rule in module.RULES]
    codes = [r.code for r in out]
    if len(set(codes)) != len(codes):
        raise RuntimeError("duplicate lint rule codes")
    return tuple(sorted(out, key=lambda r: r.code))


def by_code(code: str) -> Rule | None:
    return next((r for r in all_rules() if r.code == code), None)
