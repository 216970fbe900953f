"""`torchdoctor compare` as text, and the report's "compared with" section: the headline, then
step time and phases with their intervals, the modules that changed most, memory, ranks and
collectives of a job, loss and gradient norm, how the runs were run (what differs first, the
script's diff), new findings, and the --fail-if gates.

The report's part (`report --baseline RUN`) is the section and assets/compare.js, which draws
the baseline's curves dashed on the page's step charts once report.js has drawn them."""

from __future__ import annotations

import html
from importlib import resources
from typing import TYPE_CHECKING, Any

from torchdoctor.digest.record import Digest
from torchdoctor.report.summary import seconds
from torchdoctor.units import human

if TYPE_CHECKING:
    from torchdoctor.compare.record import Comparison, RunInfo
    from torchdoctor.compare.stats import Change

MODULES_SHOWN = 10
PHASE_LABELS = {
    "data_wait": "data wait",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "other": "other",
}


def _s(value: float | None) -> str:
    return "-" if value is None else seconds(abs(value)) if value >= 0 else "-" + seconds(-value)


def _signed(value: float | None) -> str:
    if value is None:
        return "-"
    return ("+" if value >= 0 else "-") + seconds(abs(value))


def _bytes(value: float | None, sign: bool = False) -> str:
    if value is None:
        return "-"
    if sign:
        return ("+" if value >= 0 else "-") + human(abs(value))
    return human(value)


def _interval(c: Change) -> str:
    if c.low is None:
        return "-"
    return f"{c.low:.2f}..{c.high:.2f}"


def _verdict(c: Change) -> str:
    if c.low is None:
        return "too few values"
    return "REAL" if c.real else "noise"


def _ratio(c: Change) -> str:
    return "-" if c.ratio is None else f"{c.ratio:.2f}"


def timing_rows(r: Comparison) -> list[list[str]]:
    rows = [["", "A", "B", "B/A", "95% interval", ""]]
    step = r.step_time.change
    rows.append(["step", _s(step.a), _s(step.b), _ratio(step), _interval(step), _verdict(step)])
    for p, c in r.phases.items():
        rows.append(
            [f"  {PHASE_LABELS[p]}", _s(c.a), _s(c.b), _ratio(c), _interval(c), _verdict(c)]
        )
    return rows


def module_rows(r: Comparison) -> list[list[str]]:
    rows = [["stage", "module", "A", "B", "change", "share of step", ""]]
    for m in r.modules.changes[:MODULES_SHOWN]:
        sa, sb = m.share
        share = f"{_pct(sa)} -> {_pct(sb)}"
        c = m.change
        status = {"new": "new in B", "vanished": "only in A"}.get(m.status, _verdict(c))
        rows.append([m.stage, m.module, _s(c.a), _s(c.b), _signed(c.delta), share, status])
    return rows


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def curve_lines(r: Comparison) -> list[str]:
    c = r.curves
    out = [f"  steps: A {c.steps[0]}, B {c.steps[1]}; {c.common_steps} with the same number"]
    for s, label in ((c.loss, "loss"), (c.grad_norm, "gradient norm")):
        if not s.recorded:
            out.append(f"  {label}: not recorded")
            continue
        final = s.final
        ends = f"final {_num(final[0])} (A) and {_num(final[1])} (B)"
        if s.final_change is not None:
            ends += f", {s.final_change * 100:+.1f}%"
        first = s.first_difference
        if first is None or s.at_first is None:
            out.append(f"  {label}: bit-identical over {s.compared} steps; {ends}")
            continue
        same = f"bit-identical up to step {first - 1}" if first > 0 else "differs from step 0"
        out.append(
            f"  {label}: {same}; at step {first}: {_num(s.at_first[0])} (A), "
            f"{_num(s.at_first[1])} (B)"
        )
        if s.gap_median is not None and s.gap_max is not None:
            out.append(
                f"    after it the curves are {s.gap_median * 100:.2g}% apart (median), "
                f"{s.gap_max * 100:.2g}% at most; {ends}"
            )
    return out


def _num(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else "-" if value is None else str(value)


def render_compare(r: Comparison) -> str:
    a, b = r.a, r.b
    out = [
        f"A: {a.source} ({a.steps} steps{_ranks(a)})",
        f"B: {b.source} ({b.steps} steps{_ranks(b)})",
        "",
        r.headline,
        "",
        f"Time per step (medians over {r.steps_compared}; real: the whole 95% interval "
        "of B/A lies beyond the noise floor)",
        *_table(timing_rows(r)),
        *waiting_lines(r),
    ]
    mods = r.modules
    if mods.changes:
        ta, tb = mods.traced_steps
        out += [
            "",
            f"Modules that changed most (time per traced step, children included; {ta} and "
            f"{tb} traced steps)",
            *_table(module_rows(r)),
        ]
        cause = r.cause.module
        if cause:
            many = f", {cause.instances} modules" if cause.instances > 1 else ""
            out.append(
                f"  the change is carried by {cause.stage} of {cause.module}"
                f" ({_signed(cause.delta)}{many})"
            )
    if mods.new:
        out.append(f"  new in B: {', '.join(mods.new[:20])}")
    if mods.vanished:
        out.append(f"  only in A: {', '.join(mods.vanished[:20])}")
    out += ["", *memory_lines(r)]
    if r.ranks:
        out += ["", "Ranks (median step time)"]
        for row in r.ranks:
            c = row.step_time
            if c is None:
                out.append(f"  rank {row.rank}: only in {row.only_in}")
                continue
            out.append(
                f"  rank {row.rank}: {_s(c.a)} -> {_s(c.b)} "
                f"(B/A {_ratio(c)}, {_interval(c)}, {_verdict(c)})"
            )
    if r.collectives:
        out += ["", "Collectives (per step and rank; bytes per call)"]
        for col in r.collectives:
            pa, pb = col.per_step
            ba, bb = col.bytes_per_call
            out.append(
                f"  {col.op} ({col.group}): {_num(pa)} -> {_num(pb)} per step, "
                f"{_bytes(ba)} -> {_bytes(bb)} per call"
            )
    out += ["", "Loss and gradient norm", *curve_lines(r)]
    out += ["", "How they were run", *settings_lines(r)]
    if r.script_diff:
        out += ["", "The script's diff", *("  " + x for x in r.script_diff.splitlines())]
    found = r.diagnoses
    if found.new or found.gone:
        out += ["", "Findings"]
        for d in found.new:
            out.append(f"  new in B: {d.kind} ({d.severity}, rank {d.rank}): {d.summary}")
        for d in found.gone:
            out.append(f"  only in A: {d.kind} ({d.severity}, rank {d.rank}): {d.summary}")
    if r.gates:
        out += ["", "Gates (--fail-if)"]
        for g in r.gates:
            out.append(f"  {'FAILED' if g.exceeded else 'passed'}  {g.gate}: {g.why}")
    return "\n".join(out)


def waiting_lines(r: Comparison) -> list[str]:
    wa, wb = r.waiting_for_cpu
    if wa is None or wb is None:
        return [
            "  (how long each run waited for a CPU was not recorded: the verdict is as measured)"
        ]
    up, down = r.step_time.machine_allows
    out = [
        f"  waiting for a CPU (the main thread, runnable): {wa:.0%} of A's time, {wb:.0%} of B's"
    ]
    if up > 1 or down > 1:
        way, k = ("longer", up) if up > 1 else ("shorter", down)
        out.append(
            f"  which alone can make B's steps up to {k:.2f} times {way}: a change is real "
            "only beyond that"
        )
    return out


def _ranks(run: RunInfo) -> str:
    return f", ranks {', '.join(map(str, run.ranks))}" if len(run.ranks) > 1 else ""


def memory_lines(r: Comparison) -> list[str]:
    m = r.memory
    what = "the caching allocator's" if m.device == "cuda" else "CPU: resident set size"
    peak = m.peak
    out = [
        f"Memory ({what})",
        f"  peak: {_bytes(peak.a)} (A), {_bytes(peak.b)} (B), {_bytes(peak.delta, True)}",
    ]
    for phase, row in m.phases.items():
        out.append(f"  end of {phase}: {_bytes(row.a)} (A), {_bytes(row.b)} (B)")
    if m.kinds:
        how = (
            "live census"
            if m.kinds_from == "census"
            else "parameters and gradients counted, activations measured"
        )
        out.append(f"  by kind ({how}):")
        for kind, k in m.kinds.items():
            out.append(f"    {kind}: {_bytes(k.a)} (A), {_bytes(k.b)} (B), {_bytes(k.delta, True)}")
    return out


def settings_lines(r: Comparison) -> list[str]:
    from torchdoctor.compare.settings import UNKNOWN  # not at the top: the plain report needs none

    differ = [s for s in r.settings if s.differs]
    same = [s for s in r.settings if not s.differs]
    out = []
    if not differ:
        out.append("  no recorded setting differs")
    for s in differ:
        out.append(f"  DIFFERS {s.label}: {s.a or '(none)'} (A) -> {s.b or '(none)'} (B)")
    shown = [s for s in same if not s.key.startswith("env:") and s.a == s.b]
    if shown:
        out.append("  same: " + "; ".join(f"{s.label} {s.a or '(none)'}" for s in shown))
    unknown = [s.label for s in same if UNKNOWN in (s.a, s.b)]
    close = [s for s in same if s.a != s.b and UNKNOWN not in (s.a, s.b)]
    for s in close:
        out.append(f"  close enough: {s.label} {s.a} (A), {s.b} (B)")
    if unknown:
        out.append("  not recorded in one run: " + ", ".join(unknown))
    return out


def html_section(r: Comparison) -> str:
    """The report's "compared with" section (the page's own styles)."""
    e = html.escape
    rows = "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in timing_rows(r)[1:]
    )
    mods = "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in module_rows(r)[1:]
    )
    diff = [s for s in r.settings if s.differs]
    settings = (
        "".join(
            f"<li>{e(s.label)}: <code>{e(s.a or '(none)')}</code> &rarr; "
            f"<code>{e(s.b or '(none)')}</code></li>"
            for s in diff
        )
        or "<li>no recorded setting differs</li>"
    )
    parts = [
        '<section id="compared-with"><h2>Compared with</h2>',
        f'<p class="note">A (baseline): <code>{e(str(r.a.source))}</code>; '
        f"B (this run): <code>{e(str(r.b.source))}</code>. The charts above draw the "
        "baseline dashed.</p>",
        f'<p class="headline"><b>{e(r.headline)}</b></p>',
        '<table class="grid"><tr><th></th><th>A</th><th>B</th><th>B/A</th>'
        f"<th>95% interval</th><th></th></tr>{rows}</table>",
    ]
    if r.modules.changes:
        parts.append(
            '<table class="grid"><tr><th>stage</th><th>module</th><th>A</th><th>B</th>'
            f"<th>change</th><th>share of step</th><th></th></tr>{mods}</table>"
        )
    parts.append(f"<ul>{settings}</ul>")
    loss = "".join(f"<li>{e(x.strip())}</li>" for x in curve_lines(r))
    parts.append(f"<ul>{loss}</ul>")
    if r.script_diff:
        parts.append(
            f"<details><summary>The script's diff</summary><pre>{e(r.script_diff)}</pre></details>"
        )
    parts.append("</section>")
    return "".join(parts)


def baseline_section(comparison: Comparison | None) -> str:
    """The report's "Compared with" section, with `report --baseline`."""
    return html_section(comparison) if comparison is not None else ""


def baseline_script(digest: Digest) -> str:
    """The script element that overlays the baseline's curves, when there is one."""
    if not digest.baseline:
        return ""
    code = (resources.files("torchdoctor.report") / "assets" / "compare.js").read_text("utf-8")
    if "</script" in code.lower():
        raise ValueError("compare.js contains '</script'")
    return f"<script>{code}</script>"
