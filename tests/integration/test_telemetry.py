"""Telemetry with no code changes, on real training scripts: steps, phases, losses, module
timings, models, memory rows; saved and read back, even after kill -9. The runs are recorded in
this process (tests/recording.py) but where the process is the subject: a kill -9, a live
eval, a terminal. (The TORCHDOCTOR=1 start-up hook and its DataLoader workers: on the jobs of
test_transparency.py, see the end of this file.)"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess

import pytest
from helpers import script, td_run, wait_for
from recording import query, record, td


def _saved(run_dir, sql: str):  # type: ignore[no-untyped-def]
    return query(run_dir, sql)


def _printed(stdout: str, pattern: str) -> list[float]:
    return [float(m) for m in re.findall(pattern, stdout)]


def test_mlp_steps_losses_and_phases(tmp_path) -> None:
    run = record("trainer.py", "--steps", "40", "--pause", "0", run_dir=tmp_path / "run")
    assert run.code == 0, run.output()
    rows = _saved(tmp_path / "run", "SELECT * FROM python.steps ORDER BY step")
    assert [r["step"] for r in rows] == list(range(40))
    printed = _printed(run.stdout, r"loss (\S+)")
    assert [round(r["loss"], 6) for r in rows] == pytest.approx(printed, abs=1e-6)
    for r in rows:
        parts = r["data_wait"] + r["forward"] + r["backward"] + r["optimizer"] + r["other"]
        assert parts == pytest.approx(r["duration"], rel=1e-6, abs=1e-9)
        assert min(r["data_wait"], r["forward"], r["backward"], r["optimizer"]) >= 0
        assert r["grad_norm"] > 0 and r["lr"] == pytest.approx(0.05)
        assert r["micro_batches"] == 1 and r["rss"] > 0 and r["allocated"] > 0
    assert sum(r["data_wait"] for r in rows) > 0  # the loop reads a DataLoader


def test_transformer_with_workers_and_accumulation(tmp_path) -> None:
    argv = ("--steps", "9", "--accum", "2", "--workers", "2")
    run = record("lm.py", *argv, run_dir=tmp_path / "run", trace_every=3)
    assert run.code == 0, run.output()
    d = tmp_path / "run"
    steps = _saved(d, "SELECT * FROM python.steps ORDER BY step")
    assert len(steps) == 9
    assert {s["micro_batches"] for s in steps} == {2}
    # The loss column is the mean of the tensors backward() ran on (loss / accum here).
    printed = _printed(run.stdout, r"loss (\S+)")
    for s, pair in zip(steps, zip(printed[0::2], printed[1::2], strict=True), strict=True):
        assert s["loss"] == pytest.approx(sum(pair) / 2, rel=1e-5)
    # Compute dominates this model: the measured phases cover most of the step. "other" holds
    # what runs between the model's return and backward() (the cross-entropy over the logits,
    # the print of each micro-batch's loss: 15-20% here) and the rest; the median, because a
    # step the scheduler preempts has a large rest of its own.
    for s in steps[1:]:
        assert min(s["data_wait"], s["forward"], s["backward"], s["optimizer"]) > 0, s
    rest = sorted(s["other"] / s["duration"] for s in steps[1:])
    assert rest[len(rest) // 2] < 0.3, rest
    # Module rows name the real submodules, forward and backward, on traced steps only.
    trace = _saved(d, "SELECT step, module, type, stage, duration, depth FROM python.torch_trace")
    traced = {t["step"] for t in trace}
    assert traced == {s["step"] for s in steps if s["traced"]} == {1, 4, 7}
    names = {t["module"] for t in trace}
    # The model is a local of main(), so it is named by its class.
    assert {"LM", "encoder.layers.0.self_attn", "encoder.layers.1.linear2", "head"} <= names
    assert {t["stage"] for t in trace if t["module"] == "encoder.layers.0.self_attn"} == {
        "forward",
        "backward",
    }
    by = {(t["step"], t["module"], t["stage"]): t["duration"] for t in trace}
    for step in traced:  # a model's forward time includes its children's
        assert by[(step, "LM", "forward")] >= by[(step, "encoder", "forward")]
        assert by[(step, "LM", "backward")] >= by[(step, "head", "backward")]
    modules = _saved(d, "SELECT name, type, params FROM python.modules WHERE model = 'LM'")
    per_layer = (
        (3 * 64 * 64 + 3 * 64) + (64 * 64 + 64) + (64 * 128 + 128) + (128 * 64 + 64) + 4 * 64
    )
    assert sum(m["params"] for m in modules) == 256 * 64 + 2 * per_layer + (64 * 256 + 256)
    phases = _saved(d, "SELECT DISTINCT phase FROM python.memory")
    assert {p["phase"] for p in phases} == {"setup", "forward", "backward", "optimizer"}


def test_grad_scaler_loss_is_unscaled(tmp_path) -> None:
    argv = ("--steps", "4", "--workers", "0", "--scaler")
    run = record("lm.py", *argv, run_dir=tmp_path / "run")
    assert run.code == 0, run.output()
    steps = _saved(tmp_path / "run", "SELECT loss FROM python.steps ORDER BY step")
    printed = _printed(run.stdout, r"loss (\S+)")
    assert [s["loss"] for s in steps] == pytest.approx(printed, rel=1e-5)


def test_loop_without_torch_optim(tmp_path) -> None:
    run = record("custom_step.py", run_dir=tmp_path / "run")
    assert run.code == 0, run.output()
    steps = _saved(
        tmp_path / "run", "SELECT step, loss, micro_batches FROM python.steps ORDER BY step"
    )
    assert [s["step"] for s in steps] == list(range(15))
    assert [s["loss"] for s in steps] == pytest.approx(
        _printed(run.stdout, r"loss (\S+)"), rel=1e-6
    )
    assert {s["micro_batches"] for s in steps} == {1}


def test_kill_9_leaves_a_readable_run(launch, tmp_path) -> None:
    d = tmp_path / "run"
    run = launch(td_run("--run-dir", str(d), "--trace-every", "2", script("trainer.py")))
    run.wait_probe()

    def saved_steps() -> int:
        if not (d / "tables" / "steps.seg").exists():
            return 0
        return int(_saved(d, "SELECT count(*) AS n FROM python.steps")[0]["n"])

    wait_for(lambda: saved_steps() >= 20, what="20 steps on disk")
    live = run.steps()
    run.kill()
    saved = saved_steps()
    assert saved >= 20
    assert saved <= live + 500  # nothing invented
    # The seed's slow-training and memory queries answer on the killed run too.
    slow = _saved(
        d,
        "SELECT module, stage, COUNT(*) as count, AVG(duration) as avg_time, SUM(duration) as "
        "total_time FROM python.torch_trace WHERE step > (SELECT MAX(step) - 5 FROM "
        "python.torch_trace) GROUP BY module, stage ORDER BY total_time DESC LIMIT 10",
    )
    assert slow and {r["stage"] for r in slow} == {"forward", "backward"}
    memory = _saved(
        d,
        "SELECT step, MAX(allocated) as peak_memory, MAX(allocated) - MIN(allocated) as "
        "memory_range FROM python.torch_trace WHERE step > (SELECT MAX(step) - 20 FROM "
        "python.torch_trace) GROUP BY step ORDER BY step",
    )
    assert memory and all(r["peak_memory"] > 0 for r in memory)
    meta = json.loads((d / "meta.json").read_text())
    assert meta["status"] == "running"  # it never got to say otherwise


def test_tracing_switched_on_live(launch) -> None:
    run = launch(td_run("--trace-every", "0", script("trainer.py")))
    run.wait_probe()
    run.wait_steps(3)
    assert run.query("SELECT count(*) AS n FROM python.torch_trace")[0]["n"] == 0
    out = run.cli(str(run.pid), "eval", "import torchdoctor\ntorchdoctor.configure(trace_every=1)")
    assert out.returncode == 0, out.stderr
    now = run.steps()
    run.wait_steps(now + 4)
    traced = run.query(f"SELECT DISTINCT step FROM python.torch_trace WHERE step > {now + 1}")
    assert len(traced) >= 2
    run.stop()


def test_summary_and_quiet(tmp_path) -> None:
    # `torchdoctor run` itself, through the CLI's main() in this process
    run = td("run", script("trainer.py"), "--steps", "5", "--pause", "0", cwd=tmp_path / "a")
    assert run.returncode == 0
    err = run.stderr
    assert "torchdoctor summary" in err and "5 steps in" in err and "time: data" in err
    assert "run directory:" in err
    argv = ("--quiet", script("trainer.py"), "--steps", "5", "--pause", "0")
    quiet = td("run", *argv, cwd=tmp_path / "b")
    assert quiet.returncode == 0
    assert "torchdoctor" not in quiet.stderr


def test_live_status_line_on_a_terminal(env, tmp_path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        td_run(script("trainer.py"), "--steps", "150", "--pause", "0.01"),
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            proc.send_signal(signal.SIGKILL)
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(60) == 0
    text = seen.decode(errors="replace")
    assert re.search(
        r"\r\x1b\[Ktorchdoctor \| step \d+ \| [\d.]+ \w+/step \| data \d+% \| loss", text
    ), text[-2000:]
    assert "torchdoctor summary" in text


# TORCHDOCTOR=1 with DataLoader workers started by fork and by spawn (spawned ones inherit
# TORCHDOCTOR=1 and import torch; forked ones inherit the hooks): only the training process
# starts a probe and writes a run directory, with every step. Checked on the same jobs as
# their transparency, test_transparency.py's loader_workers cases in the `env` way.
