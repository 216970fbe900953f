"""What `torchdoctor overfit` shows: the overfit mode's result (its facts, the verdict, how the
script ended), as the recipe's child process wrote it (recipe_run.py), read back in one place
(`OverfitResult.from_json`). Field names are the JSON's keys, in its order, so the verb's
`--format json` is the record itself (through the one encoder)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torchdoctor.recipes.compare import ScriptEnding

Value = float | str | None  # a number as the child wrote it ("nan" and "inf" as text)


@dataclasses.dataclass(frozen=True)
class OverfitSeries:
    """One value a step."""

    loss: list[Value]
    accuracy: list[Value]
    grad_norm: list[Value]
    update_ratio: list[Value]


@dataclasses.dataclass(frozen=True)
class ParamFacts:
    name: str
    numel: int
    requires_grad: bool
    in_optimizer: bool | None  # None: no optimizer was seen
    grad_seen: bool
    grad_nonzero: bool
    changed: bool


@dataclasses.dataclass(frozen=True)
class BatchFacts:
    """The batch fed again and again: where it was captured and what it holds."""

    source: str
    description: str
    tensors: list[str]
    fetches_in_first_step: int
    replayed: int


@dataclasses.dataclass(frozen=True)
class Suspect:
    """A reason the batch was not memorised, with its evidence (numbers by name)."""

    kind: str
    title: str
    params: list[str]
    fix: str
    evidence: dict[str, object]


@dataclasses.dataclass(frozen=True)
class FoundLine:
    """A finding of the run, as the child lists it."""

    kind: str
    severity: str
    step: int | None
    location: str | None
    summary: str


@dataclasses.dataclass(frozen=True)
class OverfitResult:
    # the mode's facts (OverfitMode.facts)
    steps: int
    limit: int
    series: OverfitSeries
    params: list[ParamFacts]
    lr: float | None
    optimizer: str | None
    loss_functions: dict[str, int]
    reductions: dict[str, int]
    label_smoothing: float | None
    findings: list[dict[str, object]]  # the loss's inputs checked: each kind's own evidence
    batch: BatchFacts
    no_batch: bool
    silent: list[tuple[str, dict[str, object]]]  # the silent-error checks' facts
    # the verdict (verdict.judge)
    kind: str
    window: int
    first_loss: Value
    final_loss: Value
    final_accuracy: float | None
    relative_loss: Value
    rule: str
    passed: bool
    suspects: list[Suspect]
    # the run (recipe_run.child)
    script: ScriptEnding | None
    run_dir: str | None
    diagnoses: list[FoundLine]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OverfitResult:
        """The result of a run that stepped (recipe_target.failed_to_run said so)."""
        series = data.get("series") or {}
        batch = data.get("batch") or {}
        return cls(
            steps=int(data["steps"]),
            limit=int(data.get("limit") or data["steps"]),
            series=OverfitSeries(**{f.name: list(series.get(f.name) or []) for f in _SERIES}),
            params=[ParamFacts(**p) for p in data.get("params") or []],
            lr=data.get("lr"),
            optimizer=data.get("optimizer"),
            loss_functions=dict(data.get("loss_functions") or {}),
            reductions=dict(data.get("reductions") or {}),
            label_smoothing=data.get("label_smoothing"),
            findings=[dict(f) for f in data.get("findings") or []],
            batch=BatchFacts(
                source=batch.get("source") or "",
                description=batch.get("description") or "",
                tensors=list(batch.get("tensors") or []),
                fetches_in_first_step=int(batch.get("fetches_in_first_step") or 0),
                replayed=int(batch.get("replayed") or 0),
            ),
            no_batch=bool(data.get("no_batch")),
            silent=[(str(k), dict(v)) for k, v in data.get("silent") or []],
            kind=data.get("kind") or "unknown",
            window=int(data.get("window") or 1),
            first_loss=data.get("first_loss"),
            final_loss=data.get("final_loss"),
            final_accuracy=data.get("final_accuracy"),
            relative_loss=data.get("relative_loss"),
            rule=data.get("rule") or "",
            passed=bool(data.get("passed")),
            suspects=[Suspect(**s) for s in data.get("suspects") or []],
            script=ScriptEnding.from_json(data.get("script")),
            run_dir=data.get("run_dir"),
            diagnoses=[FoundLine(**d) for d in data.get("diagnoses") or []],
        )


_SERIES = dataclasses.fields(OverfitSeries)
