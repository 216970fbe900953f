"""The report's data: built from SQL over a saved run, downsampled with the diagnosed steps
kept, the same whichever way the steps were fetched; and the page that carries it."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from synthetic import write_run

from torchdoctor._json import dumps
from torchdoctor.digest import build as digest
from torchdoctor.digest.record import Summary
from torchdoctor.report import html
from torchdoctor.sql.engine import SqlEngine
from torchdoctor.store.saved import open_run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("digest") / "run"
    return open_run(write_run(path, 20_000, spike_at=4_321, nan_at=15_000))


def _execute(run: Any) -> digest.Execute:
    engine = SqlEngine(run)

    def execute(sql: str) -> tuple[list[str], list[Any]]:
        result = engine.execute(sql)
        return result.columns, result.rows

    return execute


def test_the_digest_keeps_diagnosed_steps_and_extremes(run: Any) -> None:
    d = digest.build(_execute(run), run.meta, "run", steps=digest.step_columns(run.block("steps")))
    assert d.summary.steps == 20_000
    assert d.summary.last_step == 19_999
    assert [x.kind for x in d.diagnoses] == ["dataloader_bound", "nan"]
    assert [x.step for x in d.diagnoses] == [4_321, 15_000]
    for chart in (d.training, d.phases, d.memory):
        assert chart.total == 20_000
        assert chart.kept <= digest.MAX_POINTS + 4
        assert {4_321, 15_000} <= set(chart.step), chart
    # The stall is the longest step: drawn at its real height.
    phases = d.phases
    i = phases.step.index(4_321)
    assert phases.values["duration"][i] == 2.5 and phases.values["data_wait"][i] == 2.4
    # The NaN loss is no number in JSON, and is listed as not finite.
    i = d.training.step.index(15_000)
    assert d.training.values["loss"][i] is None
    assert d.training.nonfinite["loss"] == [15_000]
    # Loss decays over two decades: a log axis; grad norm stays between 1 and 2.
    assert d.training.scale == {"loss": "log", "grad_norm": "linear", "lr": "linear"}
    # plain JSON: no NaN, no numpy types; a series' columns sit beside its steps
    training = json.loads(dumps(d))["training"]
    json.dumps(training, allow_nan=False)
    assert list(training) == [
        "total",
        "kept",
        "step",
        "loss",
        "grad_norm",
        "lr",
        "scale",
        "nonfinite",
    ]


def test_fetching_through_sql_gives_the_same_digest(run: Any) -> None:
    execute = _execute(run)
    direct = digest.build(execute, run.meta, "run", steps=digest.step_columns(run.block("steps")))
    paged = digest.build(execute, run.meta, "run")  # 20,000 rows: one page, every row
    assert dataclasses.replace(paged, generated="") == dataclasses.replace(direct, generated="")


def test_a_long_live_run_is_thinned_in_sql_first(run: Any) -> None:
    execute = _execute(run)
    columns = digest.fetch_steps(execute, keep=[7_777], page=2_000)
    got = columns["step"].tolist()
    assert len(got) < 20_000 / 2
    assert {4_321, 15_000, 7_777} <= set(got)  # the stall, the NaN, and a step asked for
    assert got == sorted(got)
    d = digest.build(execute, run.meta, "run", steps=columns)
    assert d.summary.steps == 20_000  # totals come from SQL, not from the rows fetched
    assert d.phases.total == 20_000
    assert d.training.nonfinite["loss"] == [15_000]


def test_modules_and_heat_map(run: Any) -> None:
    d = digest.build(_execute(run), run.meta, "run", steps=digest.step_columns(run.block("steps")))
    mods = d.modules
    assert mods.traced_steps == 1_000
    assert [m.module for m in mods.items] == ["encoder.0", "encoder.1", "head"]
    assert mods.items[0].forward == pytest.approx(0.001)
    assert mods.items[0].backward == pytest.approx(0.001)
    heat = d.grad_heatmap
    assert heat.modules == ["encoder.0", "encoder.1", "head"]
    assert len(heat.steps) <= digest.MAX_HEAT_COLUMNS and heat.width == 100
    assert len(heat.cells) == len(heat.steps) * 3
    assert all(-3.1 <= c[2] <= 1.1 for c in heat.cells)  # log10 of norms in 1e-3..1e1


def test_spans_decades() -> None:
    assert digest.spans_decades(np.array([100.0, 1.0]))
    assert not digest.spans_decades(np.array([50.0, 1.0]))
    assert not digest.spans_decades(np.array([100.0, 0.0]))  # zero: no log axis
    assert not digest.spans_decades(np.array([100.0, -1.0, 1.0]))
    assert digest.spans_decades(np.array([1e4, math.nan, 1.0]))


def test_the_page_is_self_contained_and_escapes_what_it_shows(run: Any) -> None:
    d = digest.build(_execute(run), run.meta, "run", steps=digest.step_columns(run.block("steps")))
    first = d.diagnoses[0]
    evidence = {**first.evidence, "note": "<img src=x>"}
    summary = "</script><script>alert(1)</script> <b>bold</b>"
    shown = dataclasses.replace(first, summary=summary, evidence=evidence)
    page = html.render(dataclasses.replace(d, diagnoses=[shown, *d.diagnoses[1:]]))
    assert "<script>alert(1)" not in page and "<img src=x>" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    # The embedded digest reads back whole.
    m = re.search(r'<script type="application/json" id="td-digest">(.*?)</script>', page, re.S)
    assert m is not None
    assert json.loads(m.group(1))["diagnoses"][0]["summary"].startswith("</script>")
    # Nothing is fetched: no external scripts, styles, fonts or images.
    assert not re.search(r"<script[^>]+src=|<link\b|@import|url\(\s*['\"]?https?:", page, re.I)
    assert page.count("<script") == 3  # the data, ECharts, the glue


def test_an_empty_run_still_renders(tmp_path: Path) -> None:
    from torchdoctor.store import rundir

    path = rundir.create(tmp_path / "empty")
    rundir.write_meta(path, {"status": "running"})
    empty = open_run(path)
    d = digest.build(_execute(empty), empty.meta, "empty", steps=None)
    assert d.summary == Summary(0)
    assert json.loads(dumps(d))["summary"] == {"steps": 0}
    page = html.render(d)
    assert "Nothing was recorded for this chart." in page and "No problems found." not in page
    assert "Nothing judged: the training diagnoses need recorded steps." in page  # no step
