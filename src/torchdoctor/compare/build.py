"""Two runs' facts in, one comparison record out (record.py's Comparison): what `torchdoctor
compare` prints, `--format json` gives, `--fail-if` judges and the report's "compared with"
section shows. B is compared against A (the baseline)."""

from __future__ import annotations

import dataclasses

from torchdoctor.compare import contention, curves, gate, memory, settings, stats, timing
from torchdoctor.compare.facts import RunFacts
from torchdoctor.compare.headline import Story, headline
from torchdoctor.compare.record import (
    CauseOf,
    Comparison,
    Finding,
    Findings,
    Modules,
    RunInfo,
    StepTime,
)

VERSION = 1
_SEVERE = ("warning", "error")


def compare(
    a: RunFacts,
    b: RunFacts,
    gates: list[gate.Gate] | None = None,
    noise: float = stats.MIN_EFFECT,
) -> Comparison:
    """B against A; `noise`: the least change ever called real (a fraction: 0.1 for 10%)."""
    sa, sb = a.rank_steps(a.primary), b.rank_steps(b.primary)
    ta, tb, basis = timing.timed_steps(sa, sb)
    measured = timing.step_time(ta, tb, noise)
    waiting = contention.waiting_share(a.meta), contention.waiting_share(b.meta)
    step = contention.judge(measured, *waiting)  # beyond what the wait for a CPU allows
    phases = timing.phases(ta, tb, measured.a or 0.0, noise)
    modules = timing.module_changes(a, b, measured.a, measured.b, noise)
    new, vanished = timing.new_and_vanished(a, b)

    # The phase that carries the step's change, and in a pass the module that carries it.
    phase = phase_change = cause = None
    if step.real and step.delta is not None:
        direction = 1.0 if step.delta > 0 else -1.0
        moved = [(p, c) for p, c in phases.items() if c.real and (c.delta or 0) * direction > 0]
        if moved:
            phase, phase_change = max(moved, key=lambda pc: abs(pc[1].delta or 0.0))
            if phase in ("forward", "backward"):
                cause = timing.attribute(modules, phase, direction)

    setup = settings.settings(a, b)
    differing = sorted((s for s in setup if s.differs), key=lambda s: -s.weight)
    series = curves.compare_curves(sa, sb)
    mem = memory.compare_memory(a, b, sa, sb)
    ranks = timing.ranks(a, b, noise)
    straggler = timing.straggler(ranks)
    collectives = timing.collectives(a, b)
    new_findings, gone = _only_in(b, a), _only_in(a, b)
    record = Comparison(
        version=VERSION,
        a=_run(a),
        b=_run(b),
        headline=headline(
            Story(
                step,
                series,
                mem,
                measured=measured,
                waiting=waiting,
                phase=phase,
                phase_change=phase_change,
                cause=cause,
                differing=differing,
                new_findings=new_findings,
                straggler=straggler,
                collectives=collectives,
            )
        ),
        steps_compared=basis,
        step_time=StepTime(step, measured.real, contention.allowed(*waiting)),
        waiting_for_cpu=waiting,
        phases=phases,
        cause=CauseOf(phase, cause),
        modules=Modules(
            traced_steps=(_traced(a), _traced(b)),
            changes=modules[: timing.MAX_MODULES],
            more=max(0, len(modules) - timing.MAX_MODULES),
            new=new,
            vanished=vanished,
        ),
        memory=mem,
        ranks=ranks,
        straggler=straggler,
        collectives=collectives,
        curves=series,
        settings=setup,
        script_diff=settings.script_diff(a, b),
        diagnoses=Findings(new_findings, gone),
    )
    if not gates:
        return record
    verdicts = [gate.evaluate(g, record) for g in gates]
    return dataclasses.replace(record, gates=verdicts, failed=any(v.exceeded for v in verdicts))


def _run(f: RunFacts) -> RunInfo:
    meta = f.meta
    return RunInfo(
        source=f.source,
        steps=len(f.rank_steps(f.primary)["step"]),
        ranks=f.ranks,
        started=meta.get("started"),
        status=meta.get("status"),
        command=" ".join(str(x) for x in meta["command"])
        if isinstance(meta.get("command"), list)
        else meta.get("command"),
    )


def _only_in(f: RunFacts, other: RunFacts) -> list[Finding]:
    """`f`'s warnings and errors of a (rank, kind) that `other` has not."""
    there = {(d["rank"], d["kind"]) for d in other.diagnoses}
    return [
        Finding.of(d)
        for d in f.diagnoses
        if (d["rank"], d["kind"]) not in there and d.get("severity") in _SEVERE
    ]


def _traced(f: RunFacts) -> int:
    return len({s for m in f.modules for s in m.steps})
