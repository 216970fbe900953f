"""A crash under torchdoctor as text: what the error means for this run, the module that
raised, the shapes that flowed into it, the likely cause and the fix with the real numbers.
`torchdoctor run` prints it after the traceback; `torchdoctor diagnoses` shows the same record."""

from __future__ import annotations

import textwrap

from torchdoctor.diagnose.crash import CrashEvidence
from torchdoctor.report.explanation import code_lines

WIDTH = 100


def _wrap(text: str, first: str, indent: str) -> str:
    return textwrap.fill(
        text,
        width=WIDTH,
        initial_indent=first,
        subsequent_indent=indent,
        break_on_hyphens=False,
        break_long_words=False,
    )


def render_crash(e: CrashEvidence) -> str:
    if not e.category:
        return (
            "torchdoctor: this error is not in the catalog; `torchdoctor explain` has generic steps"
        )
    out = [f"torchdoctor: {e.category}: {e.title}", _wrap(e.explanation, "  ", "  ")]
    if e.module and e.module not in e.explanation:
        out.append(f"  raised in {e.module} ({e.module_type})")
    out += flow_lines(e)
    if e.causes:
        out.append(_wrap(e.causes[0], "  likely: ", "    "))
    if e.fixes:
        fix = e.fixes[0]
        out.append(_wrap(fix["title"], "  fix: ", "    "))
        out += code_lines(fix["code"], "    ")
    out.append(
        "  (all of it: `torchdoctor diagnoses RUN_DIR`; the module calls with their shapes: "
        "`torchdoctor shapes RUN_DIR`)"
    )
    return "\n".join(out)


def flow_lines(e: CrashEvidence) -> list[str]:
    """The module calls before the one that raised, with their shapes."""
    flow = e.flow or []
    module = e.module
    if not flow:
        inputs = e.inputs or []
        if module and inputs:
            shapes = ", ".join(f"{t.name} {t.shape}" for t in inputs)
            return [f"  {module} received: {shapes}"]
        return []
    if e.flow_live:
        head = f"  what flowed into {module or 'it'} in step {e.flow_step}:"
    else:
        head = (
            f"  the module calls of step {e.flow_step} (the last step with shapes "
            f"recorded; the crash came at step {e.step}):"
        )
    rows = []
    for call in flow:
        name = f"{call.module} ({call.type})"
        into = call.input_shapes or "-"
        result = "raised" if call.raised else call.output_shapes or "-"
        rows.append((name, into, result))
    if not e.flow_live:
        for t in e.inputs or []:
            rows.append((f"{module} now", str(t.shape), "raised"))
    w1 = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    return [head] + [f"    {a.ljust(w1)}  {b.ljust(w2)}  -> {c}" for a, b, c in rows]
