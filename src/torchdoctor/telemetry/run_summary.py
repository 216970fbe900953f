"""The end-of-run numbers of a recorded run (what `torchdoctor run` prints on stderr when the
script ends): steps, time by phase, what was found, where the run is saved; and, for a process
that trained nowhere itself, where the training went (the ranks it launched, its children)."""

from __future__ import annotations

import dataclasses
import resource
from collections.abc import Sequence
from pathlib import Path

from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.store import rundir
from torchdoctor.store.saved import load_diagnoses, rank_dirs
from torchdoctor.store.tables import BY_NAME


@dataclasses.dataclass(frozen=True)
class RankRecord:
    """A rank this process launched (mp.spawn, a forked rank), as its run directory has it."""

    rank: int
    steps: int
    findings: tuple[str, ...] = ()  # the kinds found, in order


@dataclasses.dataclass(frozen=True)
class RunSummary:
    steps: int
    run_dir: str
    duration: float = 0.0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds by phase
    skipped: int = 0  # updates skipped for non-finite gradients
    last_loss: float | None = None
    diagnoses: Sequence[Diagnosis] = ()
    exit_code: int | None = None
    crashed: bool = False
    printed: frozenset[str] = frozenset()  # identities of the findings already printed in full
    ranks: tuple[RankRecord, ...] = ()  # the ranks recorded under this run's directory
    children_cpu: float = 0.0  # CPU seconds of this process's children that ended meanwhile
    failures: tuple[str, ...] = ()  # parts of torchdoctor that failed while it recorded


def ranks_under(run_dir: Path) -> tuple[RankRecord, ...]:
    """The ranks recorded in `run_dir`'s rank<N> directories (a launcher's run directory)."""
    out = []
    for rank, path in rank_dirs(run_dir):
        try:
            steps = int(rundir.read_meta(path).get("steps") or 0)
        except (OSError, ValueError):
            steps = 0
        out.append(RankRecord(rank, steps, _kinds(path)))
    return tuple(out)


def _kinds(path: Path) -> tuple[str, ...]:
    at = BY_NAME["diagnoses"].column_names.index("kind")
    return tuple(dict.fromkeys(row[at] for row in load_diagnoses(path)))


def children_cpu() -> float:
    """CPU seconds of this process's children that have ended and been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
