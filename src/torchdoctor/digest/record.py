"""A run's digest as records: what `torchdoctor report` shows and `--format json` gives (the
one encoder writes each record as its fields in order, or through its `to_json()` where a key
appears only in some cases). build.py makes them; report/html.py reads their fields, and the
page's script reads their JSON."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor._json import fields


@dataclasses.dataclass(frozen=True)
class Series:
    """Chart series over the kept (downsampled) steps of one rank: `values` by column name
    (None where a value is not finite); `scale` (log or linear) for the training chart."""

    total: int  # the rank's steps in all
    kept: int
    step: list[int]
    values: dict[str, list[float | int | None]]
    scale: dict[str, str] | None
    nonfinite: dict[str, list[int]]  # steps whose value was NaN or infinite, by column

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"total": self.total, "kept": self.kept, "step": self.step}
        out.update(self.values)
        if self.scale is not None:
            out["scale"] = self.scale
        out["nonfinite"] = self.nonfinite
        return out


@dataclasses.dataclass(frozen=True)
class Summary:
    """The primary rank's totals (only `steps`, 0, when it has none)."""

    steps: int
    first_step: int | None = None
    last_step: int | None = None
    duration: float | None = None
    step_time_median: float | None = None
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    skipped: int = 0
    first_loss: float | str | None = None
    last_loss: float | str | None = None
    peak_memory: int | None = None

    def to_json(self) -> dict[str, Any]:
        return fields(self) if self.steps else {"steps": 0}


@dataclasses.dataclass(frozen=True)
class ModuleTime:
    """Seconds per traced step, children included, pooled over ranks."""

    module: str
    type: str
    forward: float
    backward: float
    calls: float  # per traced step


@dataclasses.dataclass(frozen=True)
class SlowModules:
    traced_steps: int
    items: list[ModuleTime]  # the slowest first
    more: int  # left out


@dataclasses.dataclass(frozen=True)
class GradHeatmap:
    """log10 of the largest gradient norm of each (module, column of `width` steps) cell:
    [column, module, log10 or None, the norm or why not]."""

    rank: int
    steps: list[int]
    width: int
    modules: list[str]
    cells: list[list[Any]]
    more: int  # modules left out


@dataclasses.dataclass(frozen=True)
class RankStat:
    rank: int
    steps: int | None
    mean: float | None
    median: float | None
    max: float | None
    data_wait: float | None  # mean


@dataclasses.dataclass(frozen=True)
class RankTimes:
    """Step time of every rank of a job (empty for one rank)."""

    ranks: list[int]
    series: list[Series]  # each rank downsampled on its own
    stats: list[RankStat]


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The latest report of one (rank, kind, location), as the page shows it."""

    id: int
    kind: str
    severity: str
    step: int | None
    rank: int | None
    location: str | None
    summary: str
    time: float | None
    evidence: dict[str, Any]  # long values cut
    fixes: list[str]
    resolved: int | None  # the step from which it no longer holds
    follows: str | None  # the finding it follows from


@dataclasses.dataclass(frozen=True)
class Baseline:
    """`report --baseline RUN`: that run's series, drawn under this run's (the comparison with
    this run as B is compare's, a layer above: the report renders it beside the digest)."""

    source: str
    training: Series
    phases: Series
    memory: Series


@dataclasses.dataclass(frozen=True)
class Digest:
    version: int
    source: str
    generated: str
    meta: dict[str, Any]  # meta.json's keys that the page shows
    ranks: list[int]
    primary_rank: int
    summary: Summary
    training: Series
    phases: Series
    memory: Series
    rank_times: RankTimes
    modules: SlowModules
    grad_heatmap: GradHeatmap
    untraced: str | None  # why no module call was traced (compile, short, off)
    diagnoses: list[Diagnosis]
    diagnoses_omitted: int
    warnings: list[str]
    baseline: Baseline | None = None

    def to_json(self) -> dict[str, Any]:
        out = fields(self)
        if self.baseline is None:
            del out["baseline"]
        return out
