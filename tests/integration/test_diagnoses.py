"""Each diagnosis kind on a realistic buggy training script, under `torchdoctor run`: kind,
location and step; the same script fixed raises nothing above info."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import clean_env, free_port, script, td_run, wait_for
from recording import query, record, td


def _diagnoses(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "diagnoses.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """finished(name, *args, **options) -> the run directory of the script recorded to its end
    in this process (tests/recording.py), once per worker: tests that judge the same run
    share it (they share an xdist_group, so that they meet on one worker)."""
    base = tmp_path_factory.mktemp("finished")
    done: dict[tuple[Any, ...], Path] = {}

    def run(name: str, *args: str, **options: Any) -> Path:
        key = (name, args, tuple(sorted(options.items())))
        if key not in done:
            d = base / str(len(done)) / "run"
            recorded = record(name, *args, run_dir=d, **options)
            assert recorded.code == 0, recorded.exception
            done[key] = d
        return done[key]

    return run


def _run(
    finished: Callable[..., Path], name: str, *args: str, **options: Any
) -> list[dict[str, Any]]:
    return _diagnoses(finished(name, *args, **options))


def _one(found: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    mine = [d for d in found if d["kind"] == kind]
    assert mine, f"no {kind} among {[(d['kind'], d['summary']) for d in found]}"
    return mine[-1]  # the latest report: a rise in severity or a location found is re-reported


# Tests that judge one run meet on one worker, where it runs once.
SHARED = {
    name: pytest.mark.xdist_group(name)
    for name in ("diag_log_softmax.py", "diag_pair_distance.py", "diag_lr_schedule.py")
}

# script, kind, location, step (exact for nan; the earliest acceptable otherwise), evidence
CASES = [
    ("diag_log_softmax.py", "nan", "head", 9, {"stage": "forward", "op": "torch.log"}),
    (
        "diag_pair_distance.py",
        "nan",
        "distance",
        14,
        {"stage": "backward", "node": "SqrtBackward0"},
    ),
    ("diag_adam_eps.py", "nan", "embed", 1, {"stage": "optimizer"}),
    ("diag_bad_data.py", "nan", "input batch", 10, {"stage": "data"}),
    ("diag_fp16_overflow.py", "nan", "proj", 8, {"stage": "forward", "dtype": "float16"}),
    ("diag_lr_schedule.py", "divergence", None, 20, {}),
    ("diag_lr_schedule.py", "exploding_gradients", "*", 20, {}),
    ("diag_deep_sigmoid.py", "vanishing_gradients", "model.0", 1, {}),  # a Sequential: named
    ("diag_frozen_by_mistake.py", "no_gradient", "image.0", 1, {}),
    ("diag_lr_zero.py", "not_learning", None, 100, {"lr": 0.0}),
    ("diag_slow_loader.py", "dataloader_bound", None, 10, {}),
    ("diag_eval_leak.py", "memory_leak", "__main__.validation_predictions", 30, {}),
    ("diag_hook_leak.py", "memory_leak", "__main__.captured", 30, {}),
]


@pytest.mark.parametrize(
    ("name", "kind", "location", "step", "evidence"),
    [pytest.param(*case, marks=[SHARED[case[0]]] if case[0] in SHARED else []) for case in CASES],
)
def test_buggy_script_is_diagnosed(
    finished, name, kind, location, step, evidence, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    if kind == "memory_leak":
        # A leak is read from the process's resident memory: in a test worker, memory freed
        # by earlier tests is reused first and hides the growth, so the process is its own.
        run_dir = tmp_path / "run"
        env = clean_env(tmp_path / "s")
        argv = td_run("--quiet", "--run-dir", str(run_dir), script(name))
        done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
        found = _diagnoses(run_dir)
    else:
        found = _run(finished, name)
    d = _one(found, kind)
    if location == "*":
        assert d["location"], d
    else:
        assert d["location"] == location, d
    if kind == "nan":
        assert d["step"] == step, d
        assert d["severity"] == "error"
    else:
        assert d["step"] >= step, d
    for key, value in evidence.items():
        assert d["evidence"][key] == value, (key, d["evidence"])
    assert d["summary"] and d["fix"], d


# The fixed versions whose runs are judged in tests/unit/test_diagnose_saved_runs.py (saved
# runs of these same scripts) are not run again here.
JUDGED_SAVED = {
    "diag_lr_schedule.py",
    "diag_deep_sigmoid.py",
    "diag_frozen_by_mistake.py",
    "diag_slow_loader.py",
    "diag_eval_leak.py",
}


@pytest.mark.parametrize("name", sorted({c[0] for c in CASES} - JUDGED_SAVED))
def test_fixed_script_raises_nothing(finished, name) -> None:  # type: ignore[no-untyped-def]
    found = _run(finished, name, "--fixed")
    loud = [(d["kind"], d["summary"]) for d in found if d["severity"] != "info"]
    assert not loud


@SHARED["diag_pair_distance.py"]
def test_backward_nan_is_reported_in_the_backward_pass_once(finished) -> None:  # type: ignore[no-untyped-def]
    found = _run(finished, "diag_pair_distance.py")
    nans = [d for d in found if d["kind"] == "nan"]
    assert len(nans) == 1
    e = nans[0]["evidence"]
    assert e["stage"] == "backward" and e["node"] == "SqrtBackward0"
    assert e["site"].endswith("diag_pair_distance.py:17")  # the torch.sqrt line
    assert e["causes"][0]["cause"].startswith("square root")


@SHARED["diag_pair_distance.py"]
def test_guard_keeps_the_weights_finite(tmp_path, finished) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "run"
    # `torchdoctor run --guard` itself, through the CLI's main() in this process
    run = td("run", "--guard", "--run-dir", d, script("diag_pair_distance.py"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    steps = query(d, "SELECT step, loss, skipped FROM python.steps ORDER BY step")
    assert all(s["skipped"] == (s["step"] >= 14) for s in steps)
    assert all(isinstance(s["loss"], float) for s in steps)  # never "nan": weights stayed finite
    nan = _one(_diagnoses(d), "nan")
    assert "--guard" in nan["summary"]
    assert "updates skipped" in run.stderr
    # Without --guard the same run goes NaN for good.
    unguarded = finished("diag_pair_distance.py")
    rows = query(unguarded, "SELECT count(*) AS n FROM python.steps WHERE isnan(loss)")
    assert rows[0]["n"] > 0


@pytest.mark.parametrize(
    ("name", "category", "line"),
    [("diag_stuck_worker.py", "dataloader", 30), ("diag_wait_upload.py", "lock", 34)],
)
def test_hang_is_found_live_while_stuck(launch, tmp_path, name, category, line) -> None:  # type: ignore[no-untyped-def]
    run = launch(td_run("--hang-timeout", "2", script(name)))
    run.wait_probe()

    def hang() -> Any:
        rows = run.ask("SELECT kind, location, evidence FROM python.diagnoses WHERE kind = 'hang'")
        return rows[0] if rows else None

    found = wait_for(hang, timeout=90, what="the hang diagnosis", interval=0.1)
    evidence = json.loads(found["evidence"])
    assert evidence["category"] == category
    assert found["location"].endswith(f"{name}:{line}")
    assert run.proc.poll() is None  # still stuck: found while the main thread is blocked
    run.kill()


def test_fixed_hang_scripts_finish_without_a_hang(finished) -> None:  # type: ignore[no-untyped-def]
    for name in ("diag_stuck_worker.py", "diag_wait_upload.py"):
        found = _run(finished, name, "--fixed", hang_timeout=2.0)
        assert not [d for d in found if d["kind"] == "hang"]


def test_collective_hang_across_ranks(launch, tmp_path, env) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    ranks = [
        launch(
            td_run("--hang-timeout", "2", script("dist_uneven.py")),
            extra_env={**common, "RANK": str(r), "LOCAL_RANK": str(r)},
            cwd=tmp_path / f"rank{r}",
        )
        for r in (0, 1)
    ]
    rank0 = ranks[0]
    rank0.wait_probe()

    def hang() -> Any:
        rows = rank0.ask(
            "SELECT location, evidence, rank FROM python.diagnoses WHERE kind = 'hang'"
        )
        return rows[0] if rows else None

    found = wait_for(hang, timeout=90, what="rank 0's hang", interval=0.1)
    assert json.loads(found["evidence"])["category"] == "collective"
    assert found["location"].endswith("dist_uneven.py:25")  # the all_reduce line
    assert found["rank"] == 0
    for run in ranks:
        run.kill()


def test_demo_lists_and_runs(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from helpers import cli

    listing = td("demo", "--list")
    assert listing.returncode == 0
    for name in ("nan", "leak", "dataloader", "divergence", "hang", "no-gradient"):
        assert name in listing.stdout
    out = cli("demo", env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    # `make demo` of the README: the banner names the command as one would type it
    assert "running: torchdoctor run nan_backward.py\n" in out.stdout, out.stdout
    assert "[nan] at step 12 in features" in out.stderr
    assert "SqrtBackward0" in out.stderr
    assert td("demo", "nope").returncode == 2


@SHARED["diag_log_softmax.py"]
def test_diagnoses_verb_on_a_saved_run(finished) -> None:  # type: ignore[no-untyped-def]
    run_dir = finished("diag_log_softmax.py")
    out = td("diagnoses", run_dir)
    assert out.returncode == 0
    assert "[error] nan at step 9 in head" in out.stdout and "1. " in out.stdout
    records = json.loads(td("diagnoses", run_dir, "--format", "json").stdout)
    assert records[0]["evidence"]["op"] == "torch.log"


# what the summary and `diagnoses` say where no step was recorded (docs/cli.md)
NOTHING_JUDGED = "nothing judged: the training diagnoses need recorded steps"


def test_a_run_without_steps_is_never_called_free_of_problems(  # type: ignore[no-untyped-def]
    tmp_path: Path, uncompiled
) -> None:
    # Inference only: no step, so no diagnosis of training ran. The summary and `diagnoses`
    # say that nothing was judged, not "no problems found"; the JSON is the empty list.
    inference = tmp_path / "inference.py"
    inference.write_text(
        "import torch\nmodel = torch.nn.Linear(4, 2)\n"
        "with torch.no_grad():\n    print(model(torch.ones(3, 4)).shape)\n"
    )
    run_dir = tmp_path / "run"
    run = td("run", "--run-dir", run_dir, inference, cwd=tmp_path)
    assert run.returncode == 0 and "torch.Size([3, 2])" in run.stdout, run
    assert "no training step was seen" in run.stderr, run.stderr
    assert NOTHING_JUDGED in run.stderr and "no problems found" not in run.stderr
    out = td("diagnoses", run_dir)
    assert (out.returncode, out.stdout.strip()) == (0, NOTHING_JUDGED), out
    assert json.loads(td("diagnoses", run_dir, "--format", "json").stdout) == []
    page = tmp_path / "report.html"
    assert td("report", run_dir, "-o", page).returncode == 0
    assert f"{NOTHING_JUDGED.capitalize()}." in page.read_text()
    assert "No problems found" not in page.read_text()


def test_a_live_process_without_steps_is_never_called_free_of_problems(  # type: ignore[no-untyped-def]
    tmp_path: Path, sockets: Path, monkeypatch: pytest.MonkeyPatch, uncompiled
) -> None:
    # This process is the live one: its endpoint answers `torchdoctor PID diagnoses` before
    # its first step (nothing judged) and after it (no problems found).
    import os

    import torch

    import torchdoctor

    monkeypatch.setenv("TORCHDOCTOR_SOCKET_DIR", str(sockets))
    ask = [str(os.getpid()), "diagnoses"]
    with torchdoctor.Session(tmp_path / "run", quiet=True):
        before = td(*ask)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
        after = td(*ask)
    assert (before.returncode, before.stdout.strip()) == (0, NOTHING_JUDGED), before
    assert (after.returncode, after.stdout.strip()) == (0, "no problems found"), after
