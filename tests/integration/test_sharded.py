"""Jobs beyond DDP: FSDP2 (`fully_shard`) and tensor parallel (`parallelize_module`) on gloo,
under torchrun. torchdoctor records every step of every rank from the local shards and issues
no collective of its own: each job trains once without the probe and once with it, in the same
processes, and the collectives torch.profiler counts in the two passes are equal op for op on
every rank (tests/scripts/dist_sharded.py --twice). The probed pass takes the tensor census after
its last optimizer step, inside the counted region: each rank holds its local shards of the
parameters, gradients and optimizer state, and FSDP2's largest unit is what an all-gather
materialises."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from helpers import internal_errors, script, site_of
from launchers import Job, torchrun_argv
from recording import query, td

from torchdoctor.units import human

pytestmark = pytest.mark.slow

# (id, ranks, the script's options). FSDP2 on 2 ranks is recorded by the jobs of the tests
# below; this one runs 4 ranks with gradient clipping (where a norm over DTensors once issued
# collectives of ours) and checks what a 2-rank job would too.
JOBS = [
    ("tp", 2, ["--tp"]),
    ("fsdp2-clip-4-ranks", 4, ["--clip"]),
]
STEPS = 6
# dist_sharded.py's Net: up = Linear(16, 32), down = Linear(32, 4), float32.
UP, DOWN = (16 * 32 + 32) * 4, (32 * 4 + 4) * 4
MODEL = UP + DOWN
# Tensor parallel on 2 ranks: up column-wise (weight and bias halved), down row-wise (weight
# halved, bias replicated).
TP_LOCAL = (16 * 16 + 16 + 4 * 16 + 4) * 4
STEP_SCALARS = 4 * 4  # AdamW's `step` of each of the 4 parameters: a plain float32 scalar


@pytest.mark.parametrize(("name", "ranks", "options"), JOBS, ids=[j[0] for j in JOBS])
def test_a_sharded_job_is_recorded_without_a_collective_of_ours(
    name: str, ranks: int, options: list[str], tmp_path: Path
) -> None:
    sockets = Path(tempfile.mkdtemp(prefix="td-"))  # short: Unix socket paths are limited
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    env.update(OMP_NUM_THREADS="1", TORCHDOCTOR_SOCKET_DIR=str(sockets), TORCHDOCTOR_QUIET="1")
    job = Job(tmp_path, env)
    run_dir = tmp_path / "job"
    try:
        argv = torchrun_argv(ranks, script("dist_sharded.py"), *options, "--twice", str(run_dir))
        job.start(argv)
        assert job.wait(240) == [0], job.output()
    finally:
        job.end()
    output = job.output()
    assert not internal_errors(output), output
    for rank in range(ranks):
        plain = (tmp_path / f"plain.rank{rank}").read_text()
        probed = (tmp_path / f"probed.rank{rank}").read_text()
        assert plain.strip(), f"rank {rank} counted no collective: {output}"
        assert probed == plain, f"rank {rank}: collectives differ\n{plain}\nvs\n{probed}"
    # the job directory read here, as `torchdoctor query JOB_DIR SQL --format json` prints it
    rows = query(
        run_dir,
        "SELECT rank, count(*) AS steps, count(grad_norm) AS norms, count(loss) AS losses"
        " FROM python.steps GROUP BY rank ORDER BY rank",
    )
    assert rows == [
        {"rank": r, "steps": STEPS, "norms": STEPS, "losses": STEPS} for r in range(ranks)
    ]
    # The script's own collectives are recorded, and none is left open at the end but those a
    # backend never reports done (gloo's reduce-scatter) of the last step.
    (counts,) = query(
        run_dir,
        "SELECT count(*) AS calls, count(*) FILTER (state = 'issued' AND step < 5) AS stale"
        " FROM python.collectives",
    )
    assert counts["calls"] > 0 and counts["stale"] == 0, counts
    # A healthy job: no false finding (a scatter's non-root ranks name no dtype).
    kinds = query(run_dir, "SELECT DISTINCT kind FROM python.diagnoses")
    assert "collective_mismatch" not in {r["kind"] for r in kinds}, kinds
    check_census(tmp_path, name, ranks)


def check_census(tmp_path: Path, name: str, ranks: int) -> None:
    """Each rank's census: its local shards, against the whole model, and the all-gather."""
    local = TP_LOCAL if name == "tp" else MODEL // ranks
    expected = {
        "parameter": (local, MODEL),
        "gradient": (local, MODEL),
        "optimizer_state": (2 * local + STEP_SCALARS, 2 * MODEL + STEP_SCALARS),
    }
    for rank in range(ranks):
        census = json.loads((tmp_path / f"census.rank{rank}.json").read_text())
        kinds = {e["kind"]: e for e in census["by_kind"]}
        for kind, (held, whole) in expected.items():
            got = kinds[kind]
            assert (got["bytes"], got["total"], got["world"]) == (held, whole, ranks), (
                rank,
                kind,
                got,
            )
        assert census["world"] == ranks
        # the last step's calls at most, not some of every step's (6 steps here)
        assert census["held_works"] <= 4, census["held_works"]
        text = census["text"]
        assert f"local shard of {human(MODEL)} total (world {ranks})" in text, text
        if name == "tp":
            assert census["units"] == [], census["units"]
            continue
        # FSDP2: `up` and `down` are units (the root holds no parameter of its own); the
        # largest all-gather is `up` whole. After the step every unit is resharded.
        assert census["units"] == [
            {"unit": "up", "parameters": 2, "unsharded": UP, "gathered": 0},
            {"unit": "down", "parameters": 2, "unsharded": DOWN, "gathered": 0},
        ], census["units"]
        assert f"unit up materialises {human(UP)}" in text, text


def _diagnosed_job(tmp_path: Path, *options: str) -> list[dict[str, Any]]:
    """dist_sharded.py with `options` on 2 ranks under TORCHDOCTOR=1; the job's findings."""
    sockets = Path(tempfile.mkdtemp(prefix="td-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    env.update(OMP_NUM_THREADS="1", TORCHDOCTOR_SOCKET_DIR=str(sockets), TORCHDOCTOR="1")
    env.update(TORCHDOCTOR_QUIET="1", TORCHDOCTOR_RUN_DIR=str(tmp_path / "job"))
    job = Job(tmp_path, env)
    try:
        job.start(torchrun_argv(2, script("dist_sharded.py"), *options))
        assert job.wait(240) == [0], job.output()
    finally:
        job.end()
        shutil.rmtree(sockets, ignore_errors=True)
    assert not internal_errors(job.output()), job.output()
    out = td("diagnoses", tmp_path / "job", "--format", "json")
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


def test_an_fsdp2_layer_never_initialised_is_named(tmp_path: Path) -> None:
    # pytorch/examples' FSDP2 example on CPU: NaN losses from the first step, because only the
    # root's own modules are initialised after to_empty(). The model cannot be run again on
    # one rank (its forward all-gathers), but its weights are read on this rank's shards.
    found = _diagnosed_job(tmp_path, "--meta-init", "--steps", "2")
    nans = [d for d in found if d["kind"] == "nan"]
    assert sorted(d["rank"] for d in nans) == [0, 1], nans  # each rank, from its own shard
    for nan in nans:
        assert (nan["step"], nan["location"]) == (0, "up"), nan
        assert "non-finite before the first update" in nan["summary"]
        fixes = nan["fix"].splitlines()
        assert fixes[0].startswith("after to_empty(), initialise every submodule"), fixes
        assert fixes[1].startswith("find them before training"), fixes


def test_a_nan_made_inside_a_tensor_parallel_model_gets_its_ops_fix(tmp_path: Path) -> None:
    # log(relu(x)) between the column- and the row-parallel layer: -inf from the first step.
    # A sharded forward is not run again (its collectives would be this rank's alone); the
    # weights and the batch are finite; the step's graph holds the log, and its fix comes first;
    # the parameters nearest the log in that graph place it: it takes up's output, feeds down.
    found = _diagnosed_job(tmp_path, "--tp", "--log-act", "--steps", "2")
    nans = [d for d in found if d["kind"] == "nan"]
    assert sorted(d["rank"] for d in nans) == [0, 1], nans
    for nan in nans:
        assert nan["step"] == 0 and "graph holds LogBackward0" in nan["summary"], nan
        assert nan["evidence"]["graph_ops"][0] == "LogBackward0", nan["evidence"]
        assert nan["location"] == "down" and nan["evidence"]["fed_by"] == "up", nan
        assert "takes the output of up and feeds down" in nan["summary"], nan["summary"]
        assert nan["fix"].splitlines()[0].startswith("clamp before the log"), nan["fix"]


def test_fsdp2_gradients_never_cleared_are_seen(tmp_path: Path) -> None:
    # FSDP2 runs no tensor hook on its sharded parameters: it sets their .grad after its
    # reduce-scatter (adding to the one there). The check reads what each backward() added.
    found = _diagnosed_job(tmp_path, "--no-zero-grad", "--steps", "5")
    cleared = [d for d in found if d["kind"] == "grad_not_cleared"]
    assert sorted(d["rank"] for d in cleared) == [0, 1], found
    assert {d["location"] for d in cleared} == {site_of("dist_sharded.py", "optimizer.step()")}
