"""The memory doctor against real training scripts in subprocesses: CPU out-of-memory errors in
the forward and in the backward explained with numbers (their saved runs judged in this
process), the census of a live run to the byte, leak holders, and the batch-size finder checked
by running its answer under an address-space cap."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, script, td_run
from recording import query, td

TiB = 1024**4


def _oom(run_dir: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "diagnoses.jsonl").read_text().splitlines()]
    ooms = [r for r in rows if r["kind"] == "oom"]
    assert len(ooms) == 1, rows
    record = ooms[0]
    if isinstance(record["evidence"], str):
        record["evidence"] = json.loads(record["evidence"])
    return record


def _figures(stdout: str) -> dict[str, int]:
    """The script's own byte counts after its last complete step."""
    lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    return lines[-1]


# The out-of-memory analysis counts every tensor of the process, to the byte: these scripts run
# in processes of their own (in a test worker it would count the other tests' tensors too).
def test_forward_oom_is_explained_and_the_exit_code_kept(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch(td_run(script("oom_train.py"), "--where", "forward", "--fail-step", "2"))
    assert run.wait() == 1, run.output()
    assert "DefaultCPUAllocator: can't allocate memory" in run.stderr()  # the traceback stays
    assert "[oom]" in run.stderr() and "in the forward of encoder.1" in run.stderr()  # alert
    (run_dir,) = run.run_dirs()
    record = _oom(run_dir)
    ev = record["evidence"]
    assert record["step"] == 2 and record["location"] == "encoder.1"
    assert record["severity"] == "error"
    assert ev["phase"] == "forward" and ev["module_type"] == "Blowup"
    assert ev["location_source"] == "traceback"
    assert ev["asked"] == 4 * TiB and "4.00 TiB" in record["summary"]
    figures = _figures(run.stdout())
    breakdown = ev["breakdown"]
    assert breakdown["parameters"] == figures["parameters"]
    assert breakdown["gradients"] == figures["gradients"]  # zero_grad(set_to_none=False)
    assert breakdown["optimizer_state"] == figures["optimizer_state"]
    assert breakdown["activations"] > 0 and breakdown["cached_unused"] is None
    assert ev["situation"]["batch_size"] == 16 and ev["situation"]["optimizer"] == "Adam"
    # No setting fits 4 TiB: the one fix is to look at the allocation itself.
    assert ev["fixes"][0]["code"] == "allocation"
    assert "4.00 TiB" in record["fix"] and "encoder.1" in record["fix"]
    # The saved run tells the whole story, and the diagnosis is in its SQL tables too (the
    # verbs over the saved run: here).
    out = td("memory", run_dir)
    assert out.returncode == 0, out.stderr
    assert "Out of memory (cpu) at step 2, in the forward of encoder.1 (Blowup)" in out.stdout
    assert "optimizer state" in out.stdout and "memory by phase" in out.stdout
    rows = query(run_dir, "SELECT kind, step, location FROM python.diagnoses")
    assert {"kind": "oom", "step": 2, "location": "encoder.1"} in rows
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["exit_code"] == 1


def test_backward_oom_in_a_custom_function_names_its_module(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch(td_run(script("oom_train.py"), "--where", "backward", "--fail-step", "1"))
    assert run.wait() == 1, run.output()
    (run_dir,) = run.run_dirs()
    record = _oom(run_dir)
    ev = record["evidence"]
    assert record["step"] == 1 and record["location"] == "encoder.1"
    assert ev["phase"] == "backward" and ev["asked"] == 4 * TiB
    # The backward runs in BlowupFn.backward: Blowup's forward is the one that calls it.
    assert ev["location_source"] == "autograd_function" and ev["function"] == "BlowupFn"
    assert ev["candidates"] == ["encoder.1"] and "guess" in ev["location_note"]
    figures = _figures(run.stdout())
    assert ev["breakdown"]["parameters"] == figures["parameters"]
    assert ev["breakdown"]["optimizer_state"] == figures["optimizer_state"]


@pytest.mark.slow
def test_realistic_oom_suggests_a_batch_size_that_runs(launch, tmp_path) -> None:
    """Batch 128 under a 300 MiB address-space cap runs out in the forward; the suggested
    batch size, with accumulation for the same effective batch, runs under the same cap.
    (Subprocesses: the script caps its own address space.)"""
    cap = ["--cap", "300", "--steps", "2", "--stop-file", ""]
    run = launch(td_run(script("memory_train.py"), "--batch-size", "128", *cap))
    assert run.wait() == 1, run.output()
    (run_dir,) = run.run_dirs()
    record = _oom(run_dir)
    ev = record["evidence"]
    assert record["step"] == 0 and ev["phase"] == "forward"
    assert record["location"].startswith("blocks.") and ev["module_type"] == "Linear"
    assert ev["memory"]["limited_by"] == "address_space_limit"
    assert 0 < ev["asked"] < 512 * 2**20
    fixes = {f["code"]: f for f in ev["fixes"]}
    assert {"batch_size", "autocast"} <= set(fixes)
    plan = fixes["batch_size"]["detail"]
    assert plan["micro_batch"] * plan["accumulation"] == 128 and plan["micro_batch"] < 128
    assert f"batch size {plan['micro_batch']} with {plan['accumulation']}" in record["fix"]
    smaller = subprocess.run(
        [sys.executable, script("memory_train.py"), "--batch-size", str(plan["micro_batch"]), *cap],
        env=run.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert smaller.returncode == 0, smaller.stderr


@pytest.fixture(scope="module")
def held(shared_launch):
    """memory_train.py after 4 Adam steps, holding its tensors until stopped, and each step's
    validation loss with its graph in a list (--leak): one live run for the census and for the
    leak holders."""
    run = shared_launch(td_run(script("memory_train.py"), "--steps", "4", "--hold", "--leak"))
    run.wait_probe()
    from helpers import wait_for

    wait_for(lambda: "held" in run.stdout(), 60, "the script to hold")
    yield run
    assert run.stop() == 0


FIGURES = """
import json
state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
size = lambda ts: sum(t.numel() * t.element_size() for t in ts)
print(json.dumps({
    "parameter": size(model.parameters()),
    "gradient": size(p.grad for p in model.parameters()),
    "optimizer_state": size(state),
}))
"""


def test_live_census_matches_model_and_optimizer_to_the_byte(held) -> None:
    rows = held.query(
        "SELECT kind, sum(bytes) AS bytes, count(*) AS n FROM python.tensors GROUP BY kind"
    )
    census = {r["kind"]: r["bytes"] for r in rows}
    out = held.cli(str(held.pid), "eval", FIGURES)
    assert out.returncode == 0, out.stderr
    own = json.loads(out.stdout)
    assert census["parameter"] == own["parameter"]
    assert census["gradient"] == own["gradient"]
    assert census["optimizer_state"] == own["optimizer_state"]
    named = held.query(
        "SELECT name, bytes FROM python.tensors WHERE kind = 'optimizer_state' "
        "AND name = 'exp_avg of blocks.0.up.weight'"
    )
    assert named == [{"name": "exp_avg of blocks.0.up.weight", "bytes": 4096 * 16 * 4}]
    # The memory verb: census by kind, the largest tensors, phases of the traced step.
    out = held.cli(str(held.pid), "memory", "--format", "json")
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    by_kind = {e["kind"]: e["bytes"] for e in view["census"]["by_kind"]}
    assert by_kind["parameter"] == own["parameter"]
    assert view["phases"] and {p["phase"] for p in view["phases"]} >= {"setup", "forward"}
    out = held.cli(str(held.pid), "memory")
    assert "tensors now" in out.stdout and "optimizer state" in out.stdout
    assert "largest tensors" in out.stdout and "memory by phase" in out.stdout


def test_leak_holders_name_the_list_that_keeps_graphs(held) -> None:
    run = held
    code = (
        "import torchdoctor.session as s\n"
        "from torchdoctor._json import dumps\n"
        "from torchdoctor.memory.holders import find_holders\n"
        "print(dumps(find_holders(s.current().telemetry, limit=3)))"
    )
    out = run.cli(str(run.pid), "eval", code)
    assert out.returncode == 0, out.stderr
    holders = json.loads(out.stdout)
    top = holders[0]
    assert top["holder"] == "__main__.losses" and top["type"] == "list"
    assert top["tensors"] == 4 and top["with_grad_fn"] == 4
    assert top["example"] == "tensor(shape=(), grad_fn=NllLossBackward0)"
    # Each kept loss holds its forward's activations: 8 samples x 64 tokens x 4096 floats
    # at least twice per block (the Linear's output and the GELU's).
    assert top["graph_bytes"] >= 4 * 2 * 2 * 8 * 64 * 4096 * 4


def _cap_rlimit(limit: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


@pytest.mark.slow
@pytest.mark.timeout(400)  # a dozen Pythons that import torch, one after the other
def test_batch_size_cli_answer_runs_and_the_next_size_does_not(env, tmp_path) -> None:
    train = [script("memory_train.py"), "--optimizer", "manual", "--steps", "2", "--stop-file", ""]
    out = cli(
        "batch-size",
        "--start",
        "32",
        "--limit-memory",
        "300MiB",
        "--format",
        "json",
        "--",
        sys.executable,
        *train,
        "--batch-size",
        "{}",
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    best = result["max_batch_size"]
    assert 32 <= best < 128 and result["first_failure"] == best + 1
    assert "batch size" in out.stderr  # progress, one line per try
    assert any(t["kind"] == "oom" for t in result["tries"])
    assert 2**20 < result["memory_per_sample"] < 16 * 2**20
    cap = result["baseline"] + result["limit_memory"]
    assert result["env"] == {"MALLOC_MMAP_THRESHOLD_": "131072"}  # the tries' steady malloc

    def attempt(size: int, limit: int = cap) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *train, "--batch-size", str(size)],
            env=dict(env, **result["env"]),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=_cap_rlimit(limit),
        )

    ok = attempt(best)
    assert ok.returncode == 0, ok.stderr
    too_big = attempt(best + 1)
    assert too_big.returncode != 0
    if "can't allocate memory" not in too_big.stderr:
        # oneDNN says "could not create a primitive" when its allocation fails under the cap:
        # the finder counted it as memory because the size ran with more room; so must we.
        roomier = attempt(best + 1, result["baseline"] + 2 * result["limit_memory"])
        assert roomier.returncode == 0, (too_big.stderr, roomier.stderr)


# bytes(n) is calloc's block of zero pages, mapped and never written: the address-space cap
# refuses it as it would a written one, without the tries writing gigabytes (seconds of CPU).
_ALLOCATES = """
import sys
size = int(sys.argv[1])
try:
    block = bytes(size * 2**20)
except MemoryError:
    sys.exit("native: could not set up the kernel")  # a library's own words for no memory
if size >= int(sys.argv[2]):
    sys.exit("ValueError: this size is not supported")  # a failure memory does not explain
"""


def test_batch_size_rechecks_a_failure_under_the_cap_with_more_room(env, tmp_path) -> None:
    (tmp_path / "alloc.py").write_text(_ALLOCATES)
    common = ["batch-size", "--start", "64", "--limit-memory", "300MiB", "--format", "json"]
    command = ["--", sys.executable, "alloc.py", "{}"]
    out = cli(*common, *command, "100000", env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    # The script does not import torch, so its whole cap (baseline + 300 MiB) is for the block.
    cap = result["baseline"] + result["limit_memory"]
    assert cap - 2**28 < result["max_batch_size"] * 2**20 < cap
    failed = [t for t in result["tries"] if not t["ok"]]
    assert failed and all(t["kind"] == "oom" for t in failed)
    assert all(t["reason"].startswith("under the limit only") for t in failed)
    assert all(t["recheck"]["ok"] for t in failed)
    assert "again, with 600.00 MiB above the baseline" in out.stderr
    # A failure that more memory does not cure stops the search and is shown.
    out = cli(*common, *command, "128", env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 1
    assert "for a reason other than memory" in out.stderr and "not supported" in out.stderr


def test_batch_size_cli_usage_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = td("batch-size", "--", sys.executable, "train.py", cwd=tmp_path)
    assert out.returncode == 2 and "{}" in out.stderr
    out = td("batch-size", "--limit-memory", "lots", "--", "python", "t.py", "{}")
    assert out.returncode == 2 and "not a size" in out.stderr
    out = td("batch-size")
    assert out.returncode == 2
