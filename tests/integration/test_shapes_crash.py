"""Shapes at every layer boundary and crashes as diagnoses, on real buggy scripts and their
fixed versions: a CNN whose flatten size was computed for another resolution (crashes in `fc1`
at step 0, a recorded step) and an RGB model handed grayscale images at step 3 (an unrecorded
step, whose exception reaches the session's excepthook as under TORCHDOCTOR=1). Recorded in this
process: `torchdoctor run` through the CLI's main(), the excepthook's way through a Session
(tests/recording.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers import script
from recording import record, td


def _diagnoses(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "diagnoses.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    for row in rows:
        if isinstance(row["evidence"], str):
            row["evidence"] = json.loads(row["evidence"])
    return rows


def test_flatten_size_crash_names_fc1_its_shapes_and_the_real_fix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = td("run", script("shape_cnn.py"), "--size", "64", cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    err = run.stderr
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x2704 and 400x120)" in err
    # The module that raised, by its qualified name, and what flowed into it in that step.
    assert "fc1 is nn.Linear(400, 120): it expects 400 input features and receives 2704" in err
    assert "what flowed into fc1 in step 0:" in err
    lines = err.splitlines()
    conv2 = next(x for x in lines if "conv2 (Conv2d)" in x)
    assert "[8, 6, 30, 30]" in conv2 and "-> [8, 16, 26, 26]" in conv2
    fc1 = next(x for x in lines if x.strip().startswith("fc1 (Linear)"))
    assert "[8, 2704]" in fc1 and fc1.endswith("-> raised")
    # The fix names the real layer with the real numbers and the line that builds it.
    assert "self.fc1 = nn.Linear(2704, 120)" in err
    assert "shape_cnn.py:22 now: self.fc1 = nn.Linear(16 * 5 * 5, 120)" in err
    assert "self.fc =" not in err and "self.fc1 = nn.LazyLinear(120)" in err
    # A crash is a diagnosis, and the summary never says "no problems found" after one.
    assert "no problems found" not in err
    assert "the script crashed before its first step ended" in err
    assert "[crash] at step 0 in fc1" in err
    (run_dir,) = (tmp_path / "torchdoctor-runs").iterdir()
    (crash,) = [d for d in _diagnoses(run_dir) if d["kind"] == "crash"]
    assert crash["location"] == "fc1" and crash["step"] == 0 and crash["severity"] == "error"
    ev = crash["evidence"]
    assert ev["category"] == "shape.matmul" and ev["phase"] == "forward"
    assert ev["module_type"] == "Linear" and ev["flow_live"] is True
    assert [c["module"] for c in ev["flow"]] == ["conv1", "pool", "conv2", "pool", "fc1"]
    (received,) = ev["inputs"]
    assert received == {"name": "input", "shape": [8, 2704], "dtype": "float32", "device": "cpu"}
    assert ev["definition"]["target"] == "self.fc1"
    assert "self.fc1 = nn.Linear(2704, 120)" in crash["fix"]
    # The saved run keeps the shapes of the batch that crashed.
    out = td("shapes", run_dir, "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["step"] == 0
    by_module = {c["module"]: c for c in data["calls"]}
    assert by_module["fc1"]["raised"] and by_module["fc1"]["input_shapes"] == "[8, 2704]"
    assert by_module["model"]["input_shapes"] == "[8, 3, 64, 64]"
    assert by_module["fc1"]["params"] == {"params": 48120, "trainable": 48120}


def test_fixed_cnn_trains_and_shapes_prints_its_tree(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = td("run", script("shape_cnn.py"), "--size", "32", "--steps", "3", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "no problems found" in run.stderr and "[crash]" not in run.stderr
    (run_dir,) = (tmp_path / "torchdoctor-runs").iterdir()
    assert not [d for d in _diagnoses(run_dir) if d["kind"] == "crash"]
    out = td("shapes", run_dir)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "step 1, rank 0: 7 module calls" in text  # the last traced step
    fc1 = next(x for x in text.splitlines() if "fc1 (Linear)" in x)
    assert fc1.split()[2:] == ["[8,", "400]", "[8,", "120]", "float32", "cpu", "48,120"]
    assert "model: 52,202 parameters, 52,202 trainable" in text
    out = td("shapes", run_dir, "--step", "0", "--format", "json")
    assert json.loads(out.stdout)["calls"][0]["output_shapes"] == "[8, 10]"
    out = td("shapes", run_dir, "--step", "7")
    assert out.returncode == 2 and "steps with shapes: 0, 1" in out.stderr


def test_grayscale_batch_on_an_untraced_step_is_named_with_the_last_recorded_shapes(
    tmp_path: Path,
) -> None:
    run = record("shape_channels.py", run_dir=tmp_path / "run", quiet=False)
    assert run.code == 1, run.output()
    assert "[crash] at step 3 in features.0" in run.stderr  # the excepthook's alert
    (crash,) = [d for d in _diagnoses(run.run_dir) if d["kind"] == "crash"]
    ev = crash["evidence"]
    assert crash["location"] == "features.0" and ev["category"] == "shape.conv_input"
    assert ev["flow_live"] is False and ev["flow_step"] == 1 and ev["step"] == 3
    assert ev["flow"][-1]["input_shapes"] == "[8, 3, 32, 32]"  # what it got when it worked
    assert ev["inputs"][0]["shape"] == [8, 1, 32, 32]  # and what it got now
    assert ev["definition"]["target"] == "self.features[0]"
    assert "self.features[0] = nn.Conv2d(1, 6, kernel_size=5)" in crash["fix"]
    fixed = record("shape_channels.py", "--fixed", run_dir=tmp_path / "fixed", quiet=False)
    assert fixed.code == 0, fixed.output()
    assert "[crash]" not in fixed.stderr


def test_a_crash_outside_backward_is_placed_at_its_line_not_at_a_traced_backward(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # On every step traced, the generator's backward is the last one started when the saver
    # raises; that guess is for errors raised inside backward() only.
    recorded = record(script("crash_after_gan_step.py"), run_dir=tmp_path / "run", trace_every=1)
    assert recorded.code == 1
    (crash,) = [d for d in _diagnoses(recorded.run_dir) if d["kind"] == "crash"]
    assert crash["evidence"]["location_source"] == "script_line", crash
    assert crash["location"].endswith("crash_after_gan_step.py:20"), crash["location"]
