"""A run's digest as one self-contained HTML page: text parts written here, charts drawn in the
browser by the vendored Apache ECharts from the digest embedded as JSON. No network needed."""

from __future__ import annotations

import html
from importlib import resources
from typing import TYPE_CHECKING, Any

from torchdoctor._json import dumps
from torchdoctor.digest.record import Digest, GradHeatmap, SlowModules, Summary
from torchdoctor.digest.time_split import LABELS, shown
from torchdoctor.report.compare import baseline_script, baseline_section
from torchdoctor.report.diagnoses import gap
from torchdoctor.report.summary import seconds
from torchdoctor.units import human

if TYPE_CHECKING:
    from torchdoctor.compare.record import Comparison

ECHARTS_VERSION = "6.1.0"
_ASSETS = resources.files("torchdoctor.report") / "assets"
_SHORT = 100  # evidence values longer than this are folded


def asset(name: str) -> str:
    return (_ASSETS / name).read_text(encoding="utf-8")


def render(digest: Digest, comparison: Comparison | None = None) -> str:
    """The page; `comparison`: `report --baseline`'s, its "Compared with" section."""
    e = html.escape
    source = str(digest.source or "")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>torchdoctor report: {e(source)}</title>",
        f"<style>{asset('report.css')}</style>",
        "</head><body>",
        "<header>",
        "<h1>torchdoctor report</h1>",
        f'<p class="meta">{_meta_line(digest.source, digest.meta, digest.ranks)}</p>',
        _cards(digest),
        "</header><main>",
        _warnings(digest),
        _diagnoses(digest),
        _chart_section(
            digest,
            "chart-training",
            "Loss and gradient norm",
            "Triangles at the top mark steps whose value was not finite (NaN or infinite). "
            "Scroll on a chart to zoom; the step charts zoom together.",
            bool(digest.training.step),
        ),
        _chart_section(
            digest,
            "chart-phases",
            "Step time by phase",
            "data: waiting for the DataLoader; forward; evaluation: model calls with gradients "
            "off (an evaluation pass between steps); compile: torch.compile compiling (taken out "
            "of the phase it happened in); backward; optimizer; other: the rest of the step "
            "(zero_grad, logging, your code). " + _phase_split(digest.summary),
            bool(digest.phases.step),
        ),
        _chart_section(
            digest,
            "chart-memory",
            "Memory",
            "On CUDA the caching allocator's allocated, reserved and peak bytes; on CPU the "
            "resident set size (and its peak).",
            bool(digest.memory.step),
        ),
        _chart_section(
            digest,
            "chart-modules",
            "Slowest modules",
            _modules_note(digest.modules, digest.untraced),
            bool(digest.modules.items),
            rows=len(digest.modules.items),
        ),
        _chart_section(
            digest,
            "chart-heatmap",
            "Gradient norm per module",
            _heatmap_note(digest.grad_heatmap, digest.untraced),
            bool(digest.grad_heatmap.cells),
            rows=len(digest.grad_heatmap.modules),
        ),
        _ranks_section(digest),
        baseline_section(comparison),
        '<pre id="td-errors" hidden></pre>',
        "</main>",
        "<footer>Written by torchdoctor from "
        f"{e(source)} on {e(str(digest.generated or ''))}. Charts drawn with "
        f"Apache ECharts {ECHARTS_VERSION} (Apache License 2.0), included in this file.</footer>",
        f'<script type="application/json" id="td-digest">{embed_json(digest)}</script>',
        f"<script>{_script_safe(asset('echarts.min.js'))}</script>",
        f"<script>{_script_safe(asset('report.js'))}</script>",
        baseline_script(digest),
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def embed_json(value: Any) -> str:
    """JSON that can sit inside a <script> element: no '</script>' or '<!--' can appear."""
    text = dumps(value, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _script_safe(code: str) -> str:
    if "</script" in code.lower():
        raise ValueError("a script asset contains '</script'")
    return code


def _meta_line(source: str, meta: dict[str, Any], ranks: list[int]) -> str:
    """Paths and the command may break anywhere (they are long); the other parts (a time, the
    host, the status) only between words, never inside a number."""
    e = html.escape
    bits = [f"<code>{e(str(source or ''))}</code>"]
    if meta.get("command"):
        bits.append(f"<code>{e(str(meta['command']))}</code>")
    words = []
    if meta.get("host"):
        words.append(f"host {e(str(meta['host']))}")
    if meta.get("started"):
        words.append(e(_when(str(meta["started"]), meta.get("ended"))))
    attached = ""
    if meta.get("attached"):
        moment = e(str(meta["attached"]).replace("T", " ").split(".")[0])
        attached = (
            f'attached at <span class="words">{moment}</span>: step 0 is the first step after '
            "it; the steps before it were not seen"
        )
    if meta.get("status"):
        status = str(meta["status"])
        if meta.get("exit_code") not in (None, 0):
            status += f" (exit code {meta['exit_code']})"
        words.append(e(status))
    if len(ranks) > 1 or meta.get("world_size"):
        size = meta.get("world_size") or len(ranks)
        words.append(f"job of {size} ranks; read: {', '.join(str(r) for r in ranks)}")
    bits += [f'<span class="words">{w}</span>' for w in words]
    if attached:
        bits.append(attached)
    return " &middot; ".join(bits)


def _when(started: str, ended: Any) -> str:
    """`2026-11-26 00:09:51 to 00:10:08` (the end's date only when it is another day)."""
    start = started.replace("T", " ").split(".")[0]
    if not ended:
        return start
    end = str(ended).replace("T", " ").split(".")[0]
    same_day = end[:10] == start[:10]
    return f"{start} to {end[11:] if same_day else end}"


def _cards(digest: Digest) -> str:
    s = digest.summary
    found = digest.diagnoses
    errors = sum(1 for d in found if d.severity == "error")
    cards = [(f"{s.steps:,}", "steps" + _rank_note(digest))]
    if s.steps:
        total = s.duration or 1e-12
        top = max(s.phases, key=lambda p: s.phases[p])
        cards += [
            (_seconds(s.duration), "step time in all"),
            (_seconds(s.step_time_median), "median step"),
            (f"{LABELS[top]} {100 * s.phases[top] / total:.0f}%", "largest phase"),
            (_value(s.last_loss), "last loss"),
            (_bytes(s.peak_memory), "peak memory"),
        ]
    cards.append((str(len(found)), f"diagnoses ({errors} errors)"))
    return (
        '<div class="cards">'
        + "".join(
            f"<div class=card><b>{html.escape(str(v))}</b><span>{html.escape(label)}</span></div>"
            for v, label in cards
        )
        + "</div>"
    )


def _phase_split(s: Summary) -> str:
    if not s.steps:
        return ""
    total = s.duration or 1e-12
    phases = s.phases
    split = ", ".join(f"{LABELS[p]} {100 * phases[p] / total:.0f}%" for p in shown(phases))
    return f"Over the whole run: {split}."


def _rank_note(digest: Digest) -> str:
    return f" (rank {digest.primary_rank})" if len(digest.ranks) > 1 else ""


def _warnings(digest: Digest) -> str:
    warnings = digest.warnings
    if not warnings:
        return ""
    items = "".join(f"<li>{html.escape(w)}</li>" for w in warnings)
    return f'<section class="warnings"><h2>Read with warnings</h2><ul>{items}</ul></section>'


def _diagnoses(digest: Digest) -> str:
    e = html.escape
    found = digest.diagnoses
    out = ['<section id="diagnoses"><h2>Diagnoses</h2>']
    if not found:  # no clean bill over a gap: no step, or parts that failed (the warnings)
        said = gap(digest.summary.steps, digest.meta.get("failures") or ()) or "no problems found"
        out.append(f'<p class="empty">{e(said.capitalize())}.</p>')
    else:
        out.append(
            '<p class="note">Each is also marked on the charts at its step (dashed line); '
            "click a mark to come back here.</p>"
        )
    for d in found:
        sev = e(str(d.severity))
        where = []
        if d.step is not None:
            where.append(f"step {d.step}")
        if len(digest.ranks) > 1 and d.rank is not None:
            where.append(f"rank {d.rank}")
        if d.location:
            where.append(f"in <code>{e(str(d.location))}</code>")
        out.append(
            f'<div class="diagnosis {sev}" id="diagnosis-{int(d.id)}" '
            f'data-kind="{e(str(d.kind))}" data-step="{e(str(d.step))}">'
            f'<h3><span class="badge {sev}">{sev}</span>{e(str(d.kind))} '
            f"<small>{' '.join(where)}</small></h3>"
        )
        if d.resolved is not None:
            out.append(
                f'<p class="note">Resolved: it no longer holds from step {int(d.resolved)}.</p>'
            )
        if d.follows:
            out.append(
                f'<p class="note">It follows <code>{e(str(d.follows))}</code>: one cause, '
                "read that finding first.</p>"
            )
        out.append(f"<p>{e(str(d.summary))}</p>")
        evidence = d.evidence or {}
        short = {k: _value(v) for k, v in evidence.items() if len(_value(v)) <= _SHORT}
        if short:
            items = "".join(
                f"<span><i>{e(str(k))}</i> <code>{e(v)}</code></span>" for k, v in short.items()
            )
            out.append(f'<p class="evidence">{items}</p>')
        for k, v in evidence.items():
            if k not in short:  # long evidence (histories, graphs) folded away
                out.append(
                    f"<details><summary>{e(str(k))}</summary><pre>{e(_value(v))}</pre></details>"
                )
        if d.fixes:  # a fix with a code block keeps its lines (white-space: pre-wrap)
            fixes = "".join(f"<li>{e(f)}</li>" for f in d.fixes)
            out.append(f'<ol class="fixes">{fixes}</ol>')
        out.append("</div>")
    if digest.diagnoses_omitted:
        out.append(
            f'<p class="note">{digest.diagnoses_omitted} less severe diagnoses are not shown: '
            "<code>torchdoctor diagnoses</code> lists them all.</p>"
        )
    out.append("</section>")
    return "".join(out)


def _chart_section(
    digest: Digest, chart_id: str, title: str, note: str, has_data: bool, rows: int = 0
) -> str:
    e = html.escape
    if not has_data:
        body = '<p class="empty">Nothing was recorded for this chart.</p>'
    else:
        # A chart of named rows (modules) grows with them; the step charts keep the CSS height.
        style = f' style="height:{100 + 26 * rows}px"' if rows else ""
        body = (
            f'<p class="note" id="{chart_id}-note"></p>'
            f'<div class="chart" id="{chart_id}"{style}></div>'
        )
    return f"<section><h2>{e(title)}</h2><p class=note>{e(note)}</p>{body}</section>"


# Why a per-module chart is empty (Digest.untraced).
_UNTRACED = {
    "compile": "Nothing was recorded per module: the run uses torch.compile, and module "
    "tracing stays off under it (module hooks would make Dynamo recompile). Steps, phases, "
    "loss, gradient norm and memory are recorded as usual.",
    "short": "Nothing was recorded per module: module calls are traced on step 1 and then one "
    "step in --trace-every (20), and this run ended before step 1.",
    "off": "Nothing was recorded per module: no step was traced (--trace-every 0 turns it off).",
}


def _modules_note(modules: SlowModules, untraced: str | None = None) -> str:
    if not modules.items:
        return _UNTRACED.get(
            untraced or "", "Module calls are timed on traced steps (--trace-every)."
        )
    more = f" ({modules.more} more not shown)" if modules.more else ""
    return (
        f"Forward and backward time per traced step, averaged over {modules.traced_steps:,} "
        f"traced steps; a module's time includes its children's{more}."
    )


def _heatmap_note(heat: GradHeatmap, untraced: str | None = None) -> str:
    if not heat.cells:
        return _UNTRACED.get(
            untraced or "",
            "Per-module gradient norms are recorded on traced steps (--trace-every).",
        )
    cols = (
        "each column one traced step"
        if heat.width == 1
        else (f"each column {heat.width} steps, its largest norm")
    )
    more = f"; {heat.more} more modules not shown" if heat.more else ""
    return (
        f"log10 of the L2 norm of each module's own gradients (rank {heat.rank}), {cols}; "
        f"black: no finite gradient{more}."
    )


def _ranks_section(digest: Digest) -> str:
    r = digest.rank_times
    if len(r.ranks) < 2:
        return ""
    rows = "".join(
        f"<tr><td>{s.rank}</td><td class=num>{s.steps:,}</td>"
        f"<td class=num>{_seconds(s.mean)}</td><td class=num>{_seconds(s.median)}</td>"
        f"<td class=num>{_seconds(s.max)}</td><td class=num>{_seconds(s.data_wait)}</td></tr>"
        for s in r.stats
    )
    table = (
        '<table class="grid"><tr><th>rank</th><th>steps</th><th>mean</th><th>median</th>'
        f"<th>max</th><th>data wait (mean)</th></tr>{rows}</table>"
    )
    return (
        "<section><h2>Step time per rank</h2>"
        '<p class="note">A rank that is slower than the others holds every collective up.</p>'
        '<p class="note" id="chart-ranks-note"></p><div class="chart" id="chart-ranks"></div>'
        f"{table}</section>"
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else seconds(value)


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list)):
        return dumps(v)
    return "-" if v is None else str(v)


def _bytes(n: Any) -> str:
    return "-" if n is None else human(int(n))
