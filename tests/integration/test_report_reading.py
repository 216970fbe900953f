"""The report read as a person reads it, in a real headless Chromium: on a run whose diagnoses
sit at adjacent steps, drawn narrow (a few pixels per step), the labels of the marks never
print over each other (their boxes, as Chromium lays them out, are compared) and still name
every kind found; the header's parts (the run's times) never wrap inside a number.

The page is the report as `torchdoctor report` writes it; a small script appended to a copy of
it measures the drawn page once the charts are in and leaves the boxes in the DOM, which
Chromium's --dump-dom hands back."""

from __future__ import annotations

import html
import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest
from browser import browser as _browser
from browser import chromium as _chromium
from helpers import cli
from recording import record

# Measures the page a second after it loaded: each chart's mark labels (SVG text naming a
# diagnosis kind) and each part of the header, as Chromium lays them out.
MEASURE = """<script>
setTimeout(function () {
  var kinds = JSON.parse(document.getElementById("td-digest").textContent).diagnoses
    .map(function (d) { return d.kind; });
  var out = { labels: {}, header: [] };
  document.querySelectorAll(".chart").forEach(function (chart) {
    out.labels[chart.id] = [];
    chart.querySelectorAll("svg text").forEach(function (t) {
      var named = kinds.some(function (k) { return t.textContent.indexOf(k) >= 0; });
      if (!named) return;
      var r = t.getBoundingClientRect();
      out.labels[chart.id].push([r.left, r.top, r.right, r.bottom, t.textContent]);
    });
  });
  document.querySelectorAll(".meta .words").forEach(function (w) {
    out.header.push([w.textContent, w.getClientRects().length]);
  });
  var pre = document.createElement("pre");
  pre.id = "td-measured";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 1000);
</script>"""


@pytest.fixture(scope="module")
def adjacent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """diag_lr_schedule.py recorded: exploding gradients and divergence one step apart, a NaN
    a few steps later."""
    run_dir = tmp_path_factory.mktemp("adjacent") / "run"
    recorded = record("diag_lr_schedule.py", run_dir=run_dir)
    steps = sorted({d["step"] for d in recorded.diagnoses() if d["step"] is not None})
    assert any(b - a == 1 for a, b in itertools.pairwise(steps)), steps
    return run_dir


def _measured(page: Path, tmp_path: Path, width: int) -> dict[str, Any]:
    binary = _chromium()
    text = page.read_text()
    end = text.rindex("</body>")
    probe = tmp_path / f"measured-{width}.html"
    probe.write_text(text[:end] + MEASURE + text[end:])
    out = _browser(
        binary, f"--window-size={width},2400", "--virtual-time-budget=5000", "--dump-dom",
        probe.as_uri(),
    )  # fmt: skip
    m = re.search(r'<pre id="td-measured">(.*?)</pre>', out.stdout, re.S)
    assert m is not None, out.stderr[-2000:]
    return dict(json.loads(html.unescape(m.group(1))))


def _overlap(a: list[Any], b: list[Any]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.slow
@pytest.mark.parametrize("width", [640, 1200])
def test_mark_labels_never_overlap_and_the_header_never_wraps_a_number(
    adjacent: Path, tmp_path: Path, width: int
) -> None:
    page = tmp_path / "report.html"
    out = cli("report", str(adjacent), "-o", str(page))
    assert out.returncode == 0, out.stderr
    measured = _measured(page, tmp_path, width)
    kinds = {
        d["kind"] for d in json.loads(cli("diagnoses", str(adjacent), "--format", "json").stdout)
    }
    for chart in ("chart-training", "chart-phases", "chart-memory"):
        labels = measured["labels"][chart]
        assert labels, f"{chart}: no mark label drawn"
        for i, a in enumerate(labels):
            for b in labels[i + 1 :]:
                assert not _overlap(a, b), f"{chart} at {width} px: {a[4]!r} over {b[4]!r}"
        named = {k for label in labels for k in label[4].split(", ")}
        assert named == kinds, (chart, named, kinds)  # nothing lost by merging labels
    for words, lines in measured["header"]:
        assert lines == 1, f"{words!r} wraps at {width} px"
    assert any(re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d to \d\d:\d\d:\d\d", w) for w, _ in
               measured["header"]), measured["header"]  # fmt: skip
