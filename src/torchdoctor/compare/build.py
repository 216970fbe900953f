"""Two runs' facts in, one comparison record out (plain JSON-ready data): what `torchdoctor
compare` prints, `--format json` gives, `--fail-if` judges and the report's "compared with"
section shows. B is compared against A (the baseline)."""

from __future__ import annotations

from typing import Any

from torchdoctor.compare import contention, curves, gate, memory, settings, stats, timing
from torchdoctor.compare.facts import RunFacts
from torchdoctor.compare.headline import Story, headline

VERSION = 1
_SEVERE = ("warning", "error")


def compare(
    a: RunFacts,
    b: RunFacts,
    gates: list[gate.Gate] | None = None,
    noise: float = stats.MIN_EFFECT,
) -> dict[str, Any]:
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
    found_a = {(d["rank"], d["kind"]) for d in a.diagnoses}
    ranks = timing.ranks(a, b, noise)
    straggler = timing.straggler(ranks)
    collectives = timing.collectives(a, b)
    new_findings = [
        d
        for d in b.diagnoses
        if (d["rank"], d["kind"]) not in found_a and d.get("severity") in _SEVERE
    ]
    record: dict[str, Any] = {
        "version": VERSION,
        "a": _run(a),
        "b": _run(b),
        "headline": headline(
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
        "steps_compared": basis,
        "step_time": {
            **step.to_json(),
            "real_as_measured": measured.real,
            # how much longer or shorter B's steps may be from the wait for a CPU alone
            "machine_allows": list(contention.allowed(*waiting)),
        },
        "waiting_for_cpu": list(waiting),
        "phases": {p: c.to_json() for p, c in phases.items()},
        "cause": {
            "phase": phase,
            "module": None if cause is None else cause.to_json(),
        },
        "modules": {
            "traced_steps": [_traced(a), _traced(b)],
            "changes": [m.to_json() for m in modules[: timing.MAX_MODULES]],
            "more": max(0, len(modules) - timing.MAX_MODULES),
            "new": new,
            "vanished": vanished,
        },
        "memory": mem,
        "ranks": ranks,
        "straggler": straggler,
        "collectives": collectives,
        "curves": series,
        "settings": [s.to_json() for s in setup],
        "script_diff": settings.script_diff(a, b),
        "diagnoses": {
            "new": [_finding(d) for d in new_findings],
            "gone": [
                _finding(d)
                for d in a.diagnoses
                if (d["rank"], d["kind"]) not in {(x["rank"], x["kind"]) for x in b.diagnoses}
                and d.get("severity") in _SEVERE
            ],
        },
    }
    if gates:
        record["gates"] = [gate.evaluate(g, record) for g in gates]
        record["failed"] = any(g["exceeded"] for g in record["gates"])
    return record


def _run(f: RunFacts) -> dict[str, Any]:
    meta = f.meta
    return {
        "source": f.source,
        "steps": len(f.rank_steps(f.primary)["step"]),
        "ranks": f.ranks,
        "started": meta.get("started"),
        "status": meta.get("status"),
        "command": " ".join(str(x) for x in meta["command"])
        if isinstance(meta.get("command"), list)
        else meta.get("command"),
    }


def _traced(f: RunFacts) -> int:
    return len({s for m in f.modules for s in m.steps})


def _finding(d: dict[str, Any]) -> dict[str, Any]:
    keep = ("rank", "kind", "severity", "location", "summary", "step")
    return {k: d.get(k) for k in keep}
