"""`torchdoctor repro` as text: the verdict, the first difference (step, op, module, call
site), the two runs side by side, the unseeded sources with their call sites, the fix."""

from __future__ import annotations

from typing import Any

from torchdoctor.recipes.compare import ReproVerdict

ROWS_SHOWN = 12


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.9g}"
    return "-" if value is None else str(value)


def render_repro(v: ReproVerdict) -> str:
    a, b = v.steps
    out = []
    if v.identical:
        out.append(f"repro PASSED: the two runs are bit-identical over {a} steps")
        out.append("  (losses, gradient norms and every parameter, compared step by step)")
    else:
        out.append(f"repro FAILED: the two runs differ ({a} and {b} steps compared)")
        first = v.first_difference
        if first is not None:
            out.append(f"  first difference at step {first.step}: {first.detail}")
            if first.op:
                kind = f" ({first.module_type})" if first.module_type else ""
                where = f" in {first.module}{kind}" if first.module else " outside any module"
                site = f" at {first.site}" if first.site else ""
                out.append(f"  first op whose output differs: {first.op}{where}{site}")
                if first.other is not None:
                    out.append(f"  {first.detail_op}")
    out.append("")
    out.append(
        f"  {'step':>4}  {'loss (run 1)':>16}  {'loss (run 2)':>16}  {'grad norm':>9}  params"
    )
    rows = v.series
    for r in rows[:ROWS_SHOWN]:
        same = "same" if r.params_equal else "DIFFER"
        grad = "same" if r.grad_norm_equal else "DIFFER"
        first_loss, second_loss = _num(r.loss[0]), _num(r.loss[1])
        out.append(f"  {r.step:>4}  {first_loss:>16}  {second_loss:>16}  {grad:>9}  {same}")
    if len(rows) > ROWS_SHOWN:
        out.append(f"  ... {len(rows) - ROWS_SHOWN} more steps (--format json has them all)")
    if v.sources:
        out.append("")
        out.append("Randomness drawn from without a seed:")
        for s in v.sources:
            out.append(f"  - {s.title}: {s.uses} draws before any seed")
            for site in s.sites:
                out.append(f"      {site}")
    if v.environment.str_hash_differs and not v.identical:
        out.append("  (PYTHONHASHSEED is not set: str hashes, so set order, differ between runs)")
    if v.fix:
        out.append("")
        out.append("Fix: at the top of the script, before anything random runs:")
        out += [f"  {line}" for line in v.fix]
    elif not v.identical:
        out.append("")
        out.append(
            "No unseeded source was seen: look at the first difference above (an op whose result "
            "depends on timing, threads or uninitialised memory, e.g. torch.empty)"
        )
    out.append("")
    out.append("run directories: " + ", ".join(str(r) for r in v.runs))
    return "\n".join(out)
