"""The comparison record, B against A: what `torchdoctor compare` prints, `--format json`
gives (the one encoder writes each record as its fields in order, or through its `to_json()`),
`--fail-if` judges and the report's "compared with" section shows. build.py makes it from the
parts that curves.py, memory.py, timing.py, settings.py and gate.py make."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor._json import fields
from torchdoctor.compare.curves import Curves
from torchdoctor.compare.memory import MemoryChange
from torchdoctor.compare.settings import Setting
from torchdoctor.compare.stats import Change
from torchdoctor.compare.timing import Cause, Collective, ModuleChange, RankTimes, Straggler


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """One of the two runs, as meta.json has it."""

    source: str
    steps: int  # on its primary rank
    ranks: list[int]
    started: str | None
    status: str | None
    command: str | None  # the command line as one string (meta.json's list joined)


@dataclasses.dataclass(frozen=True)
class StepTime:
    """The step time judged allowing for each run's wait for a CPU (`change`), and whether it
    was real as measured."""

    change: Change
    real_as_measured: bool
    # how much longer or shorter B's steps may be from the wait for a CPU alone
    machine_allows: tuple[float, float]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.change.to_json(),
            "real_as_measured": self.real_as_measured,
            "machine_allows": list(self.machine_allows),
        }


@dataclasses.dataclass(frozen=True)
class CauseOf:
    """The phase that carries the step's change, and in a pass the module that carries it."""

    phase: str | None
    module: Cause | None


@dataclasses.dataclass(frozen=True)
class Modules:
    traced_steps: tuple[int, int]
    changes: list[ModuleChange]  # the largest first, at most timing.MAX_MODULES
    more: int  # changes left out
    new: list[str]  # modules only B's models have
    vanished: list[str]  # only A's


@dataclasses.dataclass(frozen=True)
class Finding:
    """A diagnosis of one run (a warning or an error) the other run has not."""

    rank: int | None
    kind: str
    severity: str | None
    location: str | None
    summary: str | None
    step: int | None

    @classmethod
    def of(cls, d: dict[str, Any]) -> Finding:
        return cls(
            d["rank"],
            d["kind"],
            d.get("severity"),
            d.get("location"),
            d.get("summary"),
            d.get("step"),
        )


@dataclasses.dataclass(frozen=True)
class Findings:
    new: list[Finding]  # in B only
    gone: list[Finding]  # in A only


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What `torchdoctor compare` prints, `--format json` gives (through the one encoder),
    `--fail-if` judges and the report's "compared with" section shows."""

    version: int
    a: RunInfo
    b: RunInfo
    headline: str
    steps_compared: str  # which steps' times, in words
    step_time: StepTime
    waiting_for_cpu: tuple[float | None, float | None]  # share of each run's time
    phases: dict[str, Change]  # in timing.PHASES order
    cause: CauseOf
    modules: Modules
    memory: MemoryChange
    ranks: list[RankTimes] | None  # a job's ranks (None: neither run is a job)
    straggler: Straggler | None
    collectives: list[Collective] | None
    curves: Curves
    settings: list[Setting]
    script_diff: str | None
    diagnoses: Findings
    gates: list[Verdict] | None = None  # None: no --fail-if
    failed: bool | None = None  # a gate's limit exceeded

    def to_json(self) -> dict[str, Any]:
        out = fields(self)
        if self.gates is None:
            del out["gates"], out["failed"]
        return out


@dataclasses.dataclass(frozen=True)
class Verdict:
    gate: str  # as given
    exceeded: bool
    why: str  # in words
