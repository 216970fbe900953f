"""torchdoctor in a real Jupyter kernel (ipykernel, driven by nbclient): start() and the
training cell run twice, `%load_ext torchdoctor` and every `%torchdoctor` verb, the report
inline, clear errors for bad run directories, and no hang reported while the kernel idles."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.slow

TRAIN = """\
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(6):
    x = torch.randn(16, 4)
    if i == 3 and not globals().get("planted"):
        x[0, 0] = float("nan")  # one bad sample, the first time only
        planted = True
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
optimizer  # kept alive in Out[]: the next run must not keep counting this one
"""


def _text(cell: Any, name: str = "stdout") -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == name)


def _data(cell: Any, kind: str) -> list[dict[str, Any]]:
    return [o["data"] for o in cell.outputs if o.output_type == kind]


def test_notebook_kernel(env, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    run = tmp_path / "run"
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = tmp_path / "nothing"  # a run directory that recorded nothing
    (nothing / "tables").mkdir(parents=True)
    (nothing / "meta.json").write_text("{}")
    garbage = tmp_path / "garbage"
    (garbage / "tables").mkdir(parents=True)
    (garbage / "tables" / "steps.seg").write_bytes(b"not a table")

    cells = {
        "start": f"import torchdoctor\nsession = torchdoctor.start(run_dir={str(run)!r})",
        "start again": f"session = torchdoctor.start(run_dir={str(run)!r})",
        "load": "%load_ext torchdoctor",
        "load again": "%load_ext torchdoctor",
        "train": TRAIN,
        "train again": TRAIN,
        "short hang timeout": "_ = torchdoctor.configure(hang_timeout=1)",
        # (the kernel idles here for a few seconds)
        "status": "%torchdoctor status",
        "status json": "%torchdoctor status --format json",
        "diagnoses json": "%torchdoctor diagnoses --format json",
        "diagnoses": "%torchdoctor diagnoses",
        "query": "%torchdoctor query SELECT count(*) AS n, max(micro_batches) FROM python.steps",
        "query cell": "%%torchdoctor query --format json\n"
        "SELECT count(*) AS models FROM python.modules WHERE name = ''",
        "report": "%torchdoctor report",
        "saved diagnoses": f"%torchdoctor diagnoses {run} --format json",
        "hooks": "from torch.optim.optimizer import _global_optimizer_pre_hooks as pre\n"
        "from torch.optim.optimizer import _global_optimizer_post_hooks as post\n"
        "print(len(pre), len(post), len(model._forward_pre_hooks))",
        "missing": f"%torchdoctor diagnoses {tmp_path / 'missing'}",
        "empty": f"%torchdoctor query {empty} SELECT 1",
        "nothing": f"%torchdoctor report {nothing}",
        "garbage": f"%torchdoctor query --format json {garbage} SELECT count(*) FROM python.steps",
        "bad sql": "%torchdoctor query SELEC nothing",
        "stuck cell": "import time\ntime.sleep(2.5)",
        "after stuck": "%torchdoctor diagnoses --format json",
    }
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells.values()])
    client = nbclient.NotebookClient(
        nb,
        kernel_name="python3",
        timeout=120,
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    out: dict[str, Any] = {}
    with client.setup_kernel(env=env):
        for i, (name, cell) in enumerate(zip(cells, nb.cells, strict=True)):
            client.execute_cell(cell, i)
            out[name] = cell
            if name == "short hang timeout":
                # Nothing to wait for: the point is that nothing happens while the kernel
                # idles for longer than the hang timeout (1 s) and two doctor passes.
                time.sleep(3)

    errors = [o for c in out.values() for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    for name in ("start", "start again", "load", "train", "train again"):
        assert "Traceback" not in _text(out[name], "stderr"), _text(out[name], "stderr")

    # Both runs of the training cell were recorded: 12 steps, and the second model was found.
    assert f"run directory {run}" in _text(out["status"])
    assert "steps 12" in _text(out["status"])
    status = json.loads(_text(out["status json"]))
    assert status["step"] == 12 and status["run_dir"] == str(run)
    assert json.loads(_text(out["query cell"])) == [{"models": 2}]
    [table] = _data(out["query"], "display_data")
    assert "<table" in table["text/html"] and "<td>12</td>" in table["text/html"]
    assert "12" in table["text/plain"]

    # The planted NaN is found; the idle kernel was not taken for a hang.
    kinds = [d["kind"] for d in json.loads(_text(out["diagnoses json"]))]
    assert kinds == ["nan"], kinds
    assert "[error] nan at step 3" in _text(out["diagnoses"])
    saved = json.loads(_text(out["saved diagnoses"]))
    assert [d["kind"] for d in saved] == ["nan"]

    # The report: written to the run directory and shown inline in an iframe.
    [page] = _data(out["report"], "display_data")
    assert "<iframe" in page["text/html"] and "srcdoc=" in page["text/html"]
    assert "&lt;!DOCTYPE html&gt;" in page["text/html"]
    assert f"report written to {run / 'report.html'}" in _text(out["report"])
    assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")

    # Started twice, loaded twice, trained twice: one set of hooks.
    assert _text(out["hooks"]).split() == ["1", "1", "1"]

    # Bad run directories and bad SQL: one clear line each, no traceback.
    expected = {
        "missing": "missing: no such directory",
        "empty": "is empty: no torchdoctor run or job was saved there",
        "nothing": "nothing was recorded there (no steps, no diagnoses)",
        "garbage": "steps.seg is not a torchdoctor table file",
        "bad sql": "UsageError: query failed:",
    }
    for name, message in expected.items():
        stderr = _text(out[name], "stderr")
        assert message in stderr and "Traceback" not in stderr, (name, stderr)

    # The watchdog still works inside a cell: a cell stuck for longer than the timeout.
    stuck = [d for d in json.loads(_text(out["after stuck"])) if d["kind"] == "hang"]
    assert stuck and stuck[0]["evidence"]["category"] == "user_code", stuck
    assert not list(Path(env["TORCHDOCTOR_SOCKET_DIR"]).glob("*.sock"))  # kernel shut down
