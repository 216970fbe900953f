"""`torchdoctor repro` as text: the verdict, the first difference (step, op, module, call
site), the two runs side by side, the unseeded sources with their call sites, the fix."""

from __future__ import annotations

from typing import Any

ROWS_SHOWN = 12


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.9g}"
    return "-" if value is None else str(value)


def render_repro(v: dict[str, Any]) -> str:
    a, b = v["steps"]
    out = []
    if v["identical"]:
        out.append(f"repro PASSED: the two runs are bit-identical over {a} steps")
        out.append("  (losses, gradient norms and every parameter, compared step by step)")
    else:
        out.append(f"repro FAILED: the two runs differ ({a} and {b} steps compared)")
        first = v.get("first_difference") or {}
        if first:
            out.append(f"  first difference at step {first['step']}: {first['detail']}")
            if first.get("op"):
                kind = f" ({first['module_type']})" if first.get("module_type") else ""
                where = (
                    f" in {first['module']}{kind}" if first.get("module") else " outside any module"
                )
                site = f" at {first['site']}" if first.get("site") else ""
                out.append(f"  first op whose output differs: {first['op']}{where}{site}")
                if first.get("other"):
                    out.append(f"  {first['detail_op']}")
    out.append("")
    out.append(
        f"  {'step':>4}  {'loss (run 1)':>16}  {'loss (run 2)':>16}  {'grad norm':>9}  params"
    )
    rows = v.get("series") or []
    for r in rows[:ROWS_SHOWN]:
        same = "same" if r["params_equal"] else "DIFFER"
        grad = "same" if r["grad_norm_equal"] else "DIFFER"
        first, second = _num(r["loss"][0]), _num(r["loss"][1])
        out.append(f"  {r['step']:>4}  {first:>16}  {second:>16}  {grad:>9}  {same}")
    if len(rows) > ROWS_SHOWN:
        out.append(f"  ... {len(rows) - ROWS_SHOWN} more steps (--format json has them all)")
    sources = v.get("sources") or []
    if sources:
        out.append("")
        out.append("Randomness drawn from without a seed:")
        for s in sources:
            out.append(f"  - {s['title']}: {s['uses']} draws before any seed")
            for site in s["sites"]:
                out.append(f"      {site}")
    env = v.get("environment") or {}
    if env.get("str_hash_differs") and not v["identical"]:
        out.append("  (PYTHONHASHSEED is not set: str hashes, so set order, differ between runs)")
    fix = v.get("fix") or []
    if fix:
        out.append("")
        out.append("Fix: at the top of the script, before anything random runs:")
        out += [f"  {line}" for line in fix]
    elif not v["identical"]:
        out.append("")
        out.append(
            "No unseeded source was seen: look at the first difference above (an op whose result "
            "depends on timing, threads or uninitialised memory, e.g. torch.empty)"
        )
    out.append("")
    out.append("run directories: " + ", ".join(str(r) for r in v.get("runs") or []))
    return "\n".join(out)
