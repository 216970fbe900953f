"""The end-of-run summary on stderr: steps, where the time went, what was found, where it is."""

from __future__ import annotations

from collections.abc import Sequence

from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.story import chains
from torchdoctor.digest.time_split import LABELS, shown
from torchdoctor.report.alerts import headline, render_alert
from torchdoctor.report.diagnoses import gap
from torchdoctor.telemetry.run_summary import RunSummary

# CPU seconds of children that make a run without steps say where training may have gone
CHILDREN_CPU = 1.0


def seconds(value: float) -> str:
    if value < 1e-3:
        return f"{value * 1e6:.0f} us"
    if value < 1:
        return f"{value * 1e3:.1f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def render_summary(summary: RunSummary) -> str:
    steps = summary.steps
    lines = ["", "torchdoctor summary"]
    if steps:
        total = summary.duration or 1e-12
        per = summary.duration / steps
        phases = summary.phases
        split = ", ".join(f"{LABELS[k]} {100 * phases[k] / total:.0f}%" for k in shown(phases))
        lines.append(f"  {steps} steps in {seconds(summary.duration)} ({seconds(per)}/step)")
        lines.append(f"  time: {split}")
        if summary.skipped:
            lines.append(f"  {summary.skipped} updates skipped (non-finite gradients)")
    elif summary.crashed:
        lines.append("  the script crashed before its first step ended")
    elif summary.ranks:
        lines.append("  no training step in this process; the ranks it launched recorded theirs:")
        for r in summary.ranks:
            if r.findings:
                said = f"{r.steps} steps, found {', '.join(r.findings)}"
            else:  # a rank without steps was not judged: never "nothing found" over it
                said = f"{r.steps} steps, nothing found" if r.steps else "no step recorded"
            lines.append(f"    rank {r.rank}: {said}")
    else:
        lines.append(
            "  no training step was seen: no optimizer step and no gradient reset after a "
            "backward() (a loop of your own can mark its steps with torchdoctor.step(loss))"
        )
        if summary.children_cpu >= CHILDREN_CPU:
            lines.append(
                f"  its child processes used {seconds(summary.children_cpu)} of CPU: training "
                "there is followed only in the ranks of torch.distributed (torchdoctor.start() "
                "in a child's code records it, in a run directory of its own)"
            )
    found = summary.diagnoses
    if found:
        lines += ["  " + line for line in story_lines(found, summary.printed)]
    elif summary.crashed:
        lines.append("  the script crashed: see the error above")  # never "no problems found"
    elif not steps and summary.ranks:
        lines.append(f"  the job judged as one: torchdoctor diagnoses {summary.run_dir}")
    else:  # no clean bill over no step (the diagnoses of training read steps) or failed parts
        lines.append(f"  {gap(steps, summary.failures) or 'no problems found'}")
    lines.append(f"  run directory: {summary.run_dir}")
    lines.append(f'  query it: torchdoctor query {summary.run_dir} "SELECT * FROM python.steps"')
    return "\n".join(lines)


def story_lines(
    found: Sequence[Diagnosis], printed: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """The findings as one story: a chain of findings of one cause as its first finding and
    what followed; the findings that no longer hold last, one line each. A finding already
    printed in full (`printed`: their identities) is named, not said again."""
    holding = [d for d in found if d.resolved is None]
    resolved = [d for d in found if d.resolved is not None]
    noun = f"diagnos{'i' if len(found) == 1 else 'e'}s"
    head = f"{len(found)} {noun}" + (f" ({len(resolved)} resolved)" if resolved else "") + ":"
    lines = [head]
    for chain in chains(holding, lambda d: d.kind, lambda d: d.follows):
        first = chain[0]
        if first.identity in printed:
            lines.append(f"  {headline(first)} (above)")
        else:
            lines += render_alert(first, fixes=1).splitlines()
        for later in chain[1:]:
            when = f" at step {later.step}" if later.step is not None else ""
            lines.append(f"  then [{later.kind}]{when}, from the same cause: {later.summary}")
    lines += [render_alert(d) for d in resolved]
    return lines
