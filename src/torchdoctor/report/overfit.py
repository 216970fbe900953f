"""`torchdoctor overfit` as text: the verdict, the loss curve, and on a failure the suspects in
order with their evidence."""

from __future__ import annotations

from typing import Any

from torchdoctor.recipes.overfit_result import OverfitResult
from torchdoctor.report.curve import render_curve

NAMES_SHOWN = 12


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def render_overfit(r: OverfitResult) -> str:
    series = r.series
    steps = r.steps
    out = []
    mark = "PASSED" if r.passed else "FAILED"
    out.append(
        f"overfit {mark}: the model {'memorised' if r.passed else 'did not memorise'} its "
        f"first batch in {steps} steps"
    )
    facts = [f"loss {_num(r.first_loss)} -> {_num(r.final_loss)}"]
    if r.relative_loss is not None:
        facts[0] += f" ({_num(r.relative_loss)} x the first)"
    if r.final_accuracy is not None:
        facts.append(f"accuracy on the batch {r.final_accuracy:.3g}")
    out.append("  " + "; ".join(facts) + f" (median of the last {r.window} steps)")
    out.append(f"  rule ({r.kind} loss): {r.rule}")
    if r.batch.description:
        tensors = ", ".join(r.batch.tensors)
        out.append(f"  batch: {r.batch.description}" + (f": {tensors}" if tensors else ""))
    stopped = r.script is not None and r.script.stopped_by_torchdoctor
    if steps < r.limit and not stopped:
        out.append(
            f"  the script ended by itself after {steps} of the {r.limit} steps asked for; "
            f"judged on those"
        )
    out.append("")
    out.append(render_curve(series.loss, "loss"))
    accuracy = [a for a in series.accuracy if a is not None]
    if len(set(accuracy)) > 1 and not r.passed:
        out.append(render_curve(series.accuracy, "accuracy on the batch"))
    suspects = r.suspects
    if not r.passed:
        out.append("")
        if suspects:
            out.append("Suspects, in the order to check them:")
            for i, s in enumerate(suspects, 1):
                out.append(f"  {i}. {s.title}")
                names = s.params
                if names:
                    more = (
                        f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
                    )
                    out.append(f"     {', '.join(names[:NAMES_SHOWN])}{more}")
                evidence = {k: v for k, v in s.evidence.items() if k != "kind"}
                if evidence:
                    out.append(
                        "     evidence: " + ", ".join(f"{k}={_num(v)}" for k, v in evidence.items())
                    )
                out.append(f"     fix: {s.fix}")
        else:
            out.append(
                "No suspect found: the parameters train, the update size is usual and the loss's "
                "inputs look right. Try more --steps, a larger learning rate or a larger model; "
                "then suspect the architecture."
            )
    elif suspects:
        out.append("")
        out.append("Noted (it memorised anyway): " + "; ".join(s.title for s in suspects))
    found = [d for d in r.diagnoses if d.severity != "info"]
    if found:
        out.append("")
        out.append("torchdoctor also found:")
        out += [f"  [{d.kind}] {d.summary}" for d in found[:5]]
    out.append("")
    out.append(f"run directory: {r.run_dir}")
    return "\n".join(out)
