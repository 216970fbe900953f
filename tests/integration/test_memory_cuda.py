"""A real CUDA out-of-memory error, under a per-process memory cap, explained end to end: the
allocator's reserved against allocated, the breakdown, the snapshot file the memory viewer
opens, and a suggested batch size that runs. Needs a CUDA GPU (skipped without one)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest
from helpers import cli, script, td_run

pytestmark = pytest.mark.cuda

CAP = 3 * 2**30  # bytes this process may use: set_per_process_memory_fraction(CAP / total)


def _train_args() -> tuple[list[str], float]:
    import torch

    fraction = round(CAP / torch.cuda.get_device_properties(0).total_memory, 6)
    args = ["--device", "cuda", "--memory-fraction", str(fraction), "--steps", "4"]
    return [*args, "--stop-file", ""], fraction


def _oom(run_dir):
    rows = [json.loads(line) for line in (run_dir / "diagnoses.jsonl").read_text().splitlines()]
    (record,) = [r for r in rows if r["kind"] == "oom"]
    if isinstance(record["evidence"], str):
        record["evidence"] = json.loads(record["evidence"])
    return record


def test_cuda_oom_explained_end_to_end(launch, tmp_path) -> None:
    import torch

    train, fraction = _train_args()
    # Batch 1024 needs about 6 GiB of activations (each 1 GiB): over the 3 GiB cap.
    run = launch(
        td_run(
            "--trace-every",
            "1",
            script("memory_train.py"),
            *train,
            "--batch-size",
            "64",
            "--big-batch",
            "1024",
        )
    )
    assert run.wait(300) == 1, run.output()
    assert "CUDA out of memory" in run.stderr() and "[oom]" in run.stderr()
    (run_dir,) = run.run_dirs()
    record = _oom(run_dir)
    ev = record["evidence"]
    assert record["step"] == 2 and ev["phase"] in ("forward", "backward")
    assert record["location"] and record["location"].startswith(("blocks.", "head"))
    assert ev["device"] == "cuda:0" and ev["exception"] == "OutOfMemoryError"
    mem = ev["memory"]
    total = torch.cuda.get_device_properties(0).total_memory
    assert mem["fraction"] == pytest.approx(fraction)
    assert mem["capacity"] == pytest.approx(total * fraction, rel=0.01)
    assert 0 < ev["asked"] < CAP  # one activation, not an impossible request
    # Reserved against allocated, from the message: the gap is the cached-but-unused memory.
    reserved, allocated = mem["reserved_at_failure"], mem["allocated_at_failure"]
    assert reserved >= allocated > 0
    assert ev["breakdown"]["cached_unused"] == reserved - allocated
    assert ev["message_fields"]["asked"] == ev["asked"] > 0
    # The census on the GPU: parameters exactly, Adam's states exactly twice plus the steps.
    params = ev["breakdown"]["parameters"]
    assert params == json.loads(run.stdout().splitlines()[0])["parameters"]
    assert ev["breakdown"]["optimizer_state"] >= 2 * params
    assert ev["breakdown"]["activations"] > 0
    # The allocator snapshot was written and loads; the history was on after step 0.
    snapshot = ev["snapshot"]
    assert snapshot and snapshot.endswith("cuda_memory_snapshot.pickle")
    with open(snapshot, "rb") as f:
        data = pickle.load(f)
    assert data["segments"] and data.get("device_traces") and data["device_traces"][0]
    out = cli("memory", str(run_dir), env=run.env, cwd=run.cwd)
    assert "CUDA out of memory at step 2" in out.stdout and "reserved" in out.stdout
    assert "memory_viz" in out.stdout
    # The suggested batch size runs under the same cap.
    fixes = {f["code"]: f for f in ev["fixes"]}
    plan = fixes["batch_size"]["detail"]
    assert plan["micro_batch"] * plan["accumulation"] >= 1024 > plan["micro_batch"]
    smaller = subprocess.run(
        [
            sys.executable,
            script("memory_train.py"),
            *train,
            "--batch-size",
            "64",
            "--big-batch",
            str(plan["micro_batch"]),
        ],
        env=run.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert smaller.returncode == 0, smaller.stderr


def test_cuda_census_and_history_on_a_live_run(launch) -> None:
    run = launch(td_run(script("memory_train.py"), "--device", "cuda", "--steps", "3", "--hold"))
    run.wait_probe()
    from helpers import wait_for

    wait_for(lambda: "held" in run.stdout(), 120, "the script to hold")
    rows = run.query(
        "SELECT kind, sum(bytes) AS bytes FROM python.tensors WHERE device = 'cuda:0' GROUP BY kind"
    )
    census = {r["kind"]: r["bytes"] for r in rows}
    out = run.cli(
        str(run.pid),
        "eval",
        "import json\n"
        "print(json.dumps([sum(p.numel() * p.element_size() for p in model.parameters()),"
        " torch.cuda.memory_allocated()]))",
    )
    params, allocated = json.loads(out.stdout)
    assert census["parameter"] == params
    assert sum(census.values()) <= allocated
    out = run.cli(
        str(run.pid),
        "eval",
        "import torch; print(torch.cuda.memory._snapshot()['device_traces'][0] != [])",
    )
    assert out.stdout.strip() == "True"  # the bounded history is recording
    assert run.stop() == 0
