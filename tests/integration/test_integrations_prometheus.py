"""`--metrics HOST:PORT`: /metrics of a real training process in the Prometheus text format,
read with the official parser; the token rule; `torchdoctor metrics RUN_DIR|JOB_DIR`."""

from __future__ import annotations

import json
import math
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, free_port, td_run, wait_for
from prometheus_client.parser import text_string_to_metric_families

TRAIN = """\
import os, time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    optimizer.zero_grad()
    for micro in range(2):  # two accumulated micro-batches per step
        x = torch.randn(4, 8)
        if step == 3 and micro == 0:
            x[0, 0] = float("nan")
        model(x).pow(2).mean().backward()
    optimizer.step()
print("trained", flush=True)
while not os.path.exists("stop"):
    time.sleep(0.05)
"""


def _get(url: str, token: str | None = None, method: str = "GET") -> tuple[int, dict, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _launch_training(launch: Any, tmp_path: Path, *options: str, extra_env: Any = None) -> Any:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    argv = td_run(*options, str(path)) if options else [sys.executable, str(path)]
    run = launch(argv, extra_env=extra_env)
    run.wait_probe()
    wait_for(lambda: "trained" in run.stdout(), 60, "the training steps")
    return run


@pytest.mark.slow
def test_metrics_endpoint_token_and_values(launch, tmp_path) -> None:
    port = free_port()
    run = _launch_training(launch, tmp_path, "--metrics", f"127.0.0.1:{port}")
    [run_dir] = run.run_dirs()
    token = (run_dir / "token").read_text()
    assert (run_dir / "token").stat().st_mode & 0o777 == 0o600
    url = f"http://127.0.0.1:{port}/metrics"

    # The probe's rule on TCP: the token, or 401 before anything else.
    for given in (None, "", "wrong", token[:-1]):
        status, headers, _ = _get(url, given)
        assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Bearer"), given
    assert _get(f"http://127.0.0.1:{port}/nothing", None)[0] == 401
    assert _get(url, None, "POST")[0] == 401
    assert _get(url, token, "POST")[0] == 405
    assert _get(f"http://127.0.0.1:{port}/nothing", token)[0] == 404

    def scrape() -> dict:
        status, headers, text = _get(url, token)
        assert status == 200, text
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return _samples(text)

    labels = {"rank": "0", "kind": "nan", "severity": "error"}
    samples = wait_for(
        lambda: (s := scrape()) and _value(s, "torchdoctor_diagnoses_total", **labels) == 1 and s,
        30,
        "the NaN diagnosis in /metrics",
    )
    # The same numbers as SQL over the same tables.
    [row] = run.query(
        "SELECT count(*) AS n, max(step) AS last, sum(forward) AS forward FROM python.steps"
    )
    [latest] = run.query("SELECT * FROM python.steps ORDER BY step DESC LIMIT 1")
    assert _value(samples, "torchdoctor_steps_total", rank="0") == row["n"] == 8
    assert _value(samples, "torchdoctor_step", rank="0") == row["last"] == 7
    assert _value(samples, "torchdoctor_micro_batches", rank="0") == 2
    assert math.isnan(_value(samples, "torchdoctor_loss", rank="0"))  # NaN since step 3
    assert latest["loss"] == "nan"
    for name in ("duration", "allocated", "rss"):
        metric = {"duration": "torchdoctor_step_duration_seconds"}.get(
            name, f"torchdoctor_memory_{name}_bytes" if name != "rss" else "torchdoctor_rss_bytes"
        )
        assert math.isclose(_value(samples, metric, rank="0"), latest[name]), name
    phase = _value(samples, "torchdoctor_phase_seconds_total", rank="0", phase="forward")
    assert math.isclose(phase, row["forward"])
    assert _value(samples, "torchdoctor_learning_rate", rank="0") == 0.01
    assert (
        _value(samples, "torchdoctor_diagnoses_total", rank="0", kind="hang", severity="error") == 0
    )

    # Served from a daemon thread of the probe's own.
    threads = run.query(
        "SELECT daemon, probe FROM python.threads WHERE name = 'torchdoctor-metrics'"
    )
    assert threads == [{"daemon": True, "probe": True}]
    assert run.stop() == 0

    # The saved run gives the same families, as text or JSON.
    saved = cli("metrics", str(run_dir), env=run.env)
    assert saved.returncode == 0, saved.stderr
    samples = _samples(saved.stdout)
    assert _value(samples, "torchdoctor_steps_total", rank="0") == 8
    assert _value(samples, "torchdoctor_diagnoses_total", **labels) == 1
    as_json = cli("metrics", str(run_dir), "--format", "json", env=run.env)
    families = {f["name"]: f for f in json.loads(as_json.stdout)}
    assert families["torchdoctor_steps_total"]["samples"] == [
        {"labels": {"rank": "0"}, "value": 8.0}
    ]


def test_metrics_open_on_loopback_only(launch, tmp_path) -> None:
    port = free_port()
    idle = tmp_path / "idle.py"  # no torch: the endpoint serves before any training
    idle.write_text("import os, time\nwhile not os.path.exists('stop'):\n    time.sleep(0.05)\n")
    env = {"TORCHDOCTOR_METRICS": f"127.0.0.1:{port}", "TORCHDOCTOR_METRICS_OPEN": "1"}
    run = launch(td_run(str(idle)), extra_env=env)
    run.wait_probe()
    status, _, text = _get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    samples = _samples(text)  # zeros before the first step, so that alerts see the first one
    assert _value(samples, "torchdoctor_steps_total", rank="0") == 0
    assert (
        _value(samples, "torchdoctor_diagnoses_total", rank="0", kind="nan", severity="error") == 0
    )
    assert not (run.run_dirs()[0] / "token").exists()  # no token was made, none needed
    assert run.stop() == 0

    refused = launch(td_run("--metrics", f"0.0.0.0:{port}", "--metrics-open", "x.py"))
    assert refused.wait() == 2
    assert "--metrics-open is for 127.0.0.1 or ::1 only" in refused.stderr()


def test_metrics_of_a_job_and_bad_directories(env, tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from synthetic import write_run

    job = tmp_path / "job"
    write_run(job / "rank0", 300, spike_at=50, nan_at=100, rank=0)
    write_run(job / "rank1", 200, spike_at=60, nan_at=150, rank=1)
    out = cli("metrics", str(job), env=env)
    assert out.returncode == 0, out.stderr
    samples = _samples(out.stdout)
    assert _value(samples, "torchdoctor_steps_total", rank="0") == 300
    assert _value(samples, "torchdoctor_steps_total", rank="1") == 200
    assert _value(samples, "torchdoctor_step", rank="1") == 199
    for rank in ("0", "1"):
        nan = _value(
            samples, "torchdoctor_diagnoses_total", rank=rank, kind="nan", severity="error"
        )
        assert nan == 1

    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = tmp_path / "nothing"
    (nothing / "tables").mkdir(parents=True)
    garbage = tmp_path / "garbage"
    (garbage / "tables").mkdir(parents=True)
    (garbage / "tables" / "steps.seg").write_bytes(b"not a table")
    expected = {
        tmp_path / "missing": "no such directory",
        empty: "is empty",
        nothing: "nothing was recorded there",
        garbage: "is not a torchdoctor table file",
    }
    for path, message in expected.items():
        out = cli("metrics", str(path), env=env)
        assert out.returncode == 2 and message in out.stderr, (path, out.stderr)
        assert "Traceback" not in out.stderr
