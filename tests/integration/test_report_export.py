"""`report` and `export` on real training runs: the page and its data, the page drawn by a real
headless Chromium, the Perfetto trace, the tables as Parquet and CSV read back and compared with
the SQL answers, and clear errors for directories that hold no run (a live process's report:
test_probe_verbs.py). The runs are recorded and the verbs run in this process
(tests/recording.py), but for the terminal."""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser import browser, chromium
from png import read_png
from recording import query, record, td
from trace_check import check_trace

from torchdoctor._json import float_text

CHARTS = ("chart-training", "chart-phases", "chart-memory", "chart-modules", "chart-heatmap")


def _train(tmp: Path, name: str, *args: str) -> Path:
    """A real training script recorded to its end; its run directory."""
    recorded = record(name, *args, run_dir=tmp / "run")
    assert recorded.code == 0, recorded.output()
    return recorded.run_dir


@pytest.fixture(scope="module")
def diverging(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose learning rate schedule makes it diverge: diagnoses at known steps."""
    return _train(tmp_path_factory.mktemp("diverging"), "diag_lr_schedule.py")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("healthy"), "trainer.py", "--steps", "60", "--pause", "0")


def _digest(page: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="td-digest">(.*?)</script>', page, re.S)
    assert m is not None, "no digest in the page"
    return dict(json.loads(m.group(1)))


def _sql(run_dir: Path, sql: str) -> list[dict[str, Any]]:
    return query(run_dir, sql)


# -- report ----------------------------------------------------------------------------------


def test_report_of_a_diverging_run(diverging: Path, tmp_path: Path) -> None:
    page_path = tmp_path / "report.html"
    out = td("report", str(diverging), "-o", str(page_path))
    assert out.returncode == 0, out.stderr
    assert f"wrote {page_path}" in out.stderr
    page = page_path.read_text()
    digest = _digest(page)
    steps = _sql(diverging, "SELECT count(*) AS n, max(step) AS last FROM python.steps")[0]
    assert digest["summary"]["steps"] == steps["n"]
    assert digest["training"]["step"][-1] == steps["last"]
    found = {d["kind"]: d for d in digest["diagnoses"]}
    assert {"divergence", "exploding_gradients", "nan"} <= set(found)
    # A problem re-reported (a rise in severity, a location found) shows its latest report.
    saved = _sql(diverging, "SELECT kind, step FROM python.diagnoses ORDER BY time")
    latest = {row["kind"]: row["step"] for row in saved}
    assert {k: d["step"] for k, d in found.items()} == latest
    assert all(d["fixes"] for d in found.values())
    # Each diagnosis is in the page with its summary; the loss went to inf at the NaN step.
    for d in found.values():
        assert f'id="diagnosis-{d["id"]}"' in page
    assert found["nan"]["step"] in digest["training"]["nonfinite"]["loss"]
    # The loss grew by thirty decades: drawn on a log axis.
    assert digest["training"]["scale"]["loss"] == "log"
    # --format json is the same data, on stdout.
    out = td("report", str(diverging), "--format", "json")
    assert out.returncode == 0, out.stderr
    as_json = json.loads(out.stdout)
    for d in (as_json, digest):
        d.pop("generated")
    assert as_json == digest


@pytest.mark.slow
def test_chromium_draws_every_chart(diverging: Path, tmp_path: Path) -> None:
    binary = chromium()
    page = tmp_path / "report.html"
    assert td("report", str(diverging), "-o", str(page)).returncode == 0
    out = browser(binary, "--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    dom = out.stdout
    assert out.returncode == 0 and "<body" in dom, out.stderr[-2000:]
    assert 'data-report="ready"' in dom, "the page's script did not finish"
    assert re.search(r'<pre id="td-errors" hidden(="")?></pre>', dom), "a chart failed to draw"
    for chart in CHARTS:
        m = re.search(rf'<div class="chart" id="{chart}"[^>]*>(.*?)</div>\s*</section>', dom, re.S)
        assert m is not None, f"{chart} is not in the page"
        tag = re.search(rf'<div class="chart" id="{chart}"[^>]*>', dom)
        assert tag is not None and 'data-drawn="true"' in tag.group(0), f"{chart} was not drawn"
        points = re.search(r'data-points="(\d+)"', tag.group(0))
        assert points and int(points.group(1)) > 0, chart
        svg = m.group(1)
        assert "<svg" in svg and len(re.findall(r"<path ", svg)) >= 3, f"{chart}: no drawing"
    # The diagnoses are marked on the step charts: their labels are drawn in the SVG.
    training = dom[dom.index('id="chart-training"') :]
    training = training[: training.index("</section>")]
    for kind in ("divergence", "nan"):
        assert re.search(rf"<text[^>]*>[^<]*{kind}", training), f"no {kind} mark on the chart"


@pytest.mark.slow
def test_chromium_screenshot_shows_the_charts(healthy: Path, tmp_path: Path) -> None:
    binary = chromium()
    page, shot = tmp_path / "report.html", tmp_path / "shot.png"
    assert td("report", healthy, "-o", page).returncode == 0
    out = browser(binary, "--window-size=1000,800", f"--screenshot={shot}", page.as_uri())
    assert shot.exists(), out.stderr[-2000:]
    pixels = read_png(shot)[:, :, :3].astype(int)
    assert pixels.shape[:2] == (800, 1000)
    background = np.array([0xF5, 0xF7, 0xFA])
    busy = np.abs(pixels - background).sum(axis=2) > 30
    assert busy.mean() > 0.05, "the screenshot is (nearly) blank"
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 100
    # The loss line (#2563eb) is drawn: hundreds of pixels near its colour.
    loss = np.abs(pixels - np.array([0x25, 0x63, 0xEB])).sum(axis=2) < 60
    assert loss.sum() > 200, f"only {loss.sum()} pixels of the loss line"


# The report of a live process (`torchdoctor PID report`): test_probe_verbs.py, on the live
# `torchdoctor run trainer.py` that its other verbs question.


# -- export ----------------------------------------------------------------------------------


def test_perfetto_trace_of_a_real_run(diverging: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    out = td("export", str(diverging), "--perfetto", str(trace), "--format", "json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    doc = json.loads(trace.read_text())
    by_cat = check_trace(doc)
    n_steps = _sql(diverging, "SELECT count(*) AS n FROM python.steps")[0]["n"]
    calls = _sql(diverging, "SELECT stage, count(*) AS n FROM python.torch_trace GROUP BY stage")
    n_diag = _sql(diverging, "SELECT count(*) AS n FROM python.diagnoses")[0]["n"]
    assert by_cat["step"] == summary["events"]["steps"] == n_steps
    assert {r["stage"]: r["n"] for r in calls} == {
        "forward": by_cat["forward"],
        "backward": by_cat["backward"],
    }
    assert by_cat["diagnosis"] == n_diag >= 3
    assert by_cat["phase"] >= n_steps  # at least one measured phase per step


def _typed(value: str, kind: str) -> Any:
    if value == "":
        return "" if kind == "str" else None  # CSV has no NULL: an empty string reads as ''

    if kind == "int":
        return int(value)
    if kind == "float":
        return float(value)
    if kind == "bool":
        return value == "true"
    return value


def _same(a: Any, b: Any) -> bool:
    """JSON answers carry non-finite floats as the strings "nan", "inf", "-inf"."""
    if isinstance(a, float) and not math.isfinite(a) and isinstance(b, str):
        return float_text(a) == b
    return bool(a == b)


def test_tables_as_parquet_and_csv_match_sql(diverging: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from torchdoctor.store.schema import STORED

    out = td("export", str(diverging), "--parquet", str(tmp_path / "pq"), "--format", "json")
    assert out.returncode == 0, out.stderr
    written = {t["table"]: t for t in json.loads(out.stdout)["tables"]}
    assert set(written) == {spec.name for spec in STORED}
    out = td("export", str(diverging), "--csv", str(tmp_path / "csv"))
    assert out.returncode == 0, out.stderr
    nonfinite = 0
    for spec in STORED:
        expected = _sql(diverging, f"SELECT * FROM python.{spec.name}")
        table = pq.read_table(tmp_path / "pq" / f"{spec.name}.parquet")
        assert table.column_names == list(spec.column_names)
        assert table.num_rows == len(expected) == written[spec.name]["rows"]
        parquet_rows = table.to_pylist()
        with open(tmp_path / "csv" / f"{spec.name}.csv", newline="") as f:
            reader = csv.reader(f)
            assert next(reader) == list(spec.column_names)
            csv_rows = [
                {c.name: _typed(v, c.type) for c, v in zip(spec.columns, row, strict=True)}
                for row in reader
            ]
        for want, got_pq, got_csv in zip(expected, parquet_rows, csv_rows, strict=True):
            for col in spec.column_names:
                assert _same(got_pq[col], want[col]), (spec.name, col, got_pq[col], want[col])
                want_csv = "" if want[col] is None and got_csv[col] == "" else want[col]
                assert _same(got_csv[col], want_csv), (spec.name, col, got_csv[col], want[col])
                if want[col] in ("nan", "inf", "-inf") and isinstance(got_pq[col], float):
                    nonfinite += 1
    assert nonfinite > 0, "the diverging run has an inf loss: NaN/inf must survive the export"


# -- errors ----------------------------------------------------------------------------------


@pytest.fixture
def not_runs(tmp_path: Path) -> Iterator[dict[str, Path]]:
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = tmp_path / "nothing"  # a run directory in which nothing was recorded
    (nothing / "tables").mkdir(parents=True)
    (nothing / "meta.json").write_text('{"status": "running"}')
    broken = tmp_path / "broken"
    (broken / "tables").mkdir(parents=True)
    (broken / "tables" / "steps.seg").write_bytes(b"this is not a table")
    yield {"empty": empty, "nothing": nothing, "broken": broken, "missing": tmp_path / "nope"}


@pytest.mark.parametrize(
    ("which", "message"),
    [
        ("empty", "is empty"),
        ("missing", "no such directory"),
        ("broken", "steps.seg is not a torchdoctor table file"),
        ("nothing", "nothing was recorded"),
    ],
)
def test_clear_errors_for_directories_without_a_run(
    not_runs: dict[str, Path], tmp_path: Path, which: str, message: str
) -> None:
    path = str(not_runs[which])
    for argv in (
        ["report", path, "-o", str(tmp_path / "r.html")],
        ["export", path, "--perfetto", str(tmp_path / "t.json")],
        ["export", path, "--csv", str(tmp_path / "csv")],
    ):
        out = td(*argv)
        assert out.returncode == 2, (argv, out.stdout, out.stderr)
        assert message in out.stderr and "Traceback" not in out.stderr, out.stderr
    if which != "nothing":  # a run with nothing recorded still answers SQL (with no rows)
        out = td("query", path, "SELECT * FROM python.steps")
        assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "t.json").exists()


def test_usage_errors_of_export(healthy: Path, tmp_path: Path) -> None:
    out = td("export", str(healthy))
    assert out.returncode == 2 and "one of the arguments" in out.stderr
    out = td("export", str(healthy), "--csv", str(tmp_path / "c"), "--steps", "1:2")
    assert out.returncode == 2 and "--steps goes with --perfetto" in out.stderr
    out = td("export", str(healthy), "--perfetto", str(tmp_path / "t.json"), "--steps", "9:3")
    assert out.returncode == 2 and "FROM <= TO" in out.stderr
    out = td("export", str(healthy), "--perfetto", str(tmp_path / "t.json"), "--steps", "10:19")
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    check_trace(doc)
    assert sorted(e["args"]["step"] for e in doc["traceEvents"] if e.get("cat") == "step") == list(
        range(10, 20)
    )


def test_report_needs_a_file_for_a_terminal(healthy: Path) -> None:
    # A pseudo-terminal on stdout: the page is not dumped onto it.
    import pty

    code = (
        "import sys; from torchdoctor.cli.main import main; "
        f"sys.exit(main(['report', {str(healthy)!r}]))"
    )
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout is the terminal
        os.execv(sys.executable, [sys.executable, "-c", code])
    chunks = []
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 2
    assert b"give -o FILE.html" in b"".join(chunks)
