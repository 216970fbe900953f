"""The CUDA paths, on a real GPU (skipped without one): no host sync in the hot path, and a
float16 overflow under autocast found and localized."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from helpers import cli, internal_errors, script, strip_ours, td_run

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("trace_every", ["0", "1", "20"])
def test_hot_path_makes_no_host_sync(launch, tmp_path, trace_every) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "run"
    run = launch(
        td_run("--run-dir", str(d), "--trace-every", trace_every, script("cuda_no_sync.py"))
    )
    assert run.wait(180) == 0, run.output()
    assert "no sync" in run.stdout()
    assert not internal_errors(run.stderr()), run.stderr()
    out = cli(
        "query",
        str(d),
        "SELECT count(*) AS n, count(loss) AS losses FROM python.steps",
        "--format",
        "json",
    )
    rows = json.loads(out.stdout)[0]
    assert rows["n"] == 40 and rows["losses"] == 40  # every row read back, asynchronously
    # the traced steps' module timings, read once a copy queued after their events landed
    out = cli("query", str(d), "SELECT count(DISTINCT step) AS n FROM python.torch_trace")
    traced = {"0": 0, "1": 39, "20": 2}[trace_every]  # steps 1-39; 1 and 21
    assert out.stdout.split()[2] == str(traced), out.stdout


def test_silent_checks_on_a_gpu_find_a_dropped_zero_grad_without_a_sync(launch, tmp_path):  # type: ignore[no-untyped-def]
    # 60 steps: the checks' later pair (50, 51) runs under sync debug mode "error" too.
    d = tmp_path / "run"
    run = launch(
        td_run("--quiet", "--run-dir", str(d), script("cuda_no_sync.py"), "60", "--no-zero-grad")
    )
    assert run.wait(180) == 0, run.output()
    assert "no sync" in run.stdout()
    assert not internal_errors(run.stderr()), run.stderr()
    found = [json.loads(line) for line in (d / "diagnoses.jsonl").read_text().splitlines()]
    assert "grad_not_cleared" in {f["kind"] for f in found}, found


def _fp16_nan(launch, tmp_path, options: list[str], args: list[str]) -> dict:  # type: ignore[no-untyped-def]
    """The nan finding of `torchdoctor run OPTIONS diag_fp16_overflow.py --device cuda ARGS`,
    with the run's stderr."""
    d = tmp_path / "run"
    argv = [*options, "--quiet", "--run-dir", str(d), script("diag_fp16_overflow.py")]
    run = launch(td_run(*argv, "--device", "cuda", *args))
    assert run.wait(180) == 0, run.output()
    found = [json.loads(line) for line in (d / "diagnoses.jsonl").read_text().splitlines()]
    nan = next(f for f in found if f["kind"] == "nan")
    return dict(nan, stderr=run.stderr())


def test_fp16_overflow_under_autocast_is_found(launch, tmp_path) -> None:
    nan = _fp16_nan(launch, tmp_path, ["--guard"], [])
    assert nan["step"] == 8 and nan["location"] == "proj"
    assert nan["evidence"]["stage"] == "forward" and nan["evidence"]["dtype"] == "float16"
    assert nan["evidence"]["causes"][0]["cause"].startswith("float16 overflow")


def test_fp16_overflow_without_guard_is_still_named(launch, tmp_path) -> None:
    # The check is read back late on CUDA: the update has happened. The localizer arms a
    # synchronous check and names the module whose weights went non-finite. Read late means up
    # to 16 quick steps (readback.py's BATCH): of 20 steps, the NaN of step 8 can be read at
    # the run's end, with no step left to name it in: the cause of its failures on 2 of 7 GPU
    # calls (NaN found, no module named). A run goes on after a NaN, and so does this one: 60
    # steps: right in the 11 H100 runs whose logs were kept ("Fifth GPU session").
    nan = _fp16_nan(launch, tmp_path, [], ["--steps", "60"])
    assert nan["location"] in {"proj", "body.1", "head"}, nan


def test_device_side_assert_ends_as_it_does_without_torchdoctor(launch, env, tmp_path) -> None:
    # Found on a real H100 (torch 2.11): under torchdoctor the process aborted at exit (a
    # pinned buffer freed in a broken context), a false detached_loss was said (a graph walk
    # stopped short), and a silent check stacked a CPU scalar with GPU values. Later the error
    # was raised a line early, in optimizer.step(): first by CUDA calls of ours (an event
    # query, a pinned allocation; the read-back asks the device nothing now, readback.py), and
    # since then, under load, by torch's own call in Adam's step (its stream-capture check),
    # once the device had reported the fault: the host time a step costs under torchdoctor
    # lets the device get there first (docs/benchmarks.md, "Fifth GPU session"). So the test
    # takes the line plain Python met or that earlier line of the same step, raised in torch.
    plain = subprocess.run(
        [sys.executable, script("cuda_device_assert.py")],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    d = tmp_path / "run"
    run = launch(td_run("--run-dir", str(d), script("cuda_device_assert.py")))
    assert run.wait(180) == plain.returncode == 1, run.output()
    assert run.stdout() == plain.stdout
    # the same traceback (strip_ours drops the blank line before our block: the message's own)
    ours, theirs = strip_ours(run.stderr()), strip_ours(plain.stderr).rstrip("\n") + "\n"
    if ours != theirs:
        assert _where_cuda_said_it(theirs)[0] == 32, plain.stderr
        line, frames = _where_cuda_said_it(ours)
        assert line == 31 and all("/torch/" in f for f in frames), ours
        assert _without_frames(ours) == _without_frames(theirs), ours
    assert "terminate called" not in run.stderr()
    found = [json.loads(line) for line in (d / "diagnoses.jsonl").read_text().splitlines()]
    assert [f["kind"] for f in found if f["severity"] == "error"] == ["crash"], found
    crash = found[0]["evidence"]
    assert crash["category"] == "cuda.device_assert"
    assert "embedding" in crash["causes"][0], crash["causes"]


def _where_cuda_said_it(stderr: str) -> tuple[int, list[str]]:
    """(the script's line in the traceback, the files of the frames below it)."""
    files = re.findall(r'^  File "([^"]+)", line (\d+)', stderr, re.M)
    line = next(int(n) for f, n in files if f.endswith("cuda_device_assert.py"))
    return line, [f for f, _ in files if not f.endswith("cuda_device_assert.py")]


def _without_frames(stderr: str) -> str:
    """The traceback's text without its frames: the kernel's asserts and the error."""
    head, _, tail = stderr.partition("Traceback (most recent call last):\n")
    error = [line for line in tail.splitlines(keepends=True) if not line.startswith(" ")]
    return head + "".join(error)


def test_a_cpu_model_beside_an_initialized_gpu_keeps_the_cpu_path(tmp_path) -> None:
    # A process that touched CUDA once (a library, an earlier model) training a CPU model: the
    # step's values are read at once, with no copies to a GPU and back (which cost 560 us a
    # step on an H100 machine's CPU).
    import torch

    import torchdoctor

    torch.zeros(1, device="cuda")
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.Session(tmp_path / "run", quiet=True) as s:
        for _ in range(5):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        assert s.telemetry is not None and not s.telemetry.rows.cuda
        assert len(s.telemetry.readback) == 0
        # memory is the process's (hundreds of MB), not the GPU allocator's 512 bytes
        assert s.telemetry.memory.read_now()[0] > 50 * 2**20


def test_a_loss_moved_to_the_cpu_before_backward_is_still_a_gpu_step(tmp_path, capfd) -> None:  # type: ignore[no-untyped-def]
    # The model and its gradients are on the GPU; the loss the loop calls backward() on is
    # not: the step is a GPU step, its gradient norm read back without a sync.
    import torch

    import torchdoctor

    model = torch.nn.Linear(8, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.Session(tmp_path / "run", quiet=True) as s:
        for _ in range(5):
            loss = model(torch.randn(4, 8, device="cuda")).pow(2).mean().cpu()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        assert s.telemetry is not None and s.telemetry.rows.cuda
    assert not internal_errors(capfd.readouterr().err)
    out = cli(
        "query",
        str(tmp_path / "run"),
        "SELECT count(*) AS n, count(loss) AS losses, count(grad_norm) AS norms FROM python.steps",
        "--format",
        "json",
    )
    assert json.loads(out.stdout)[0] == {"n": 5, "losses": 5, "norms": 5}


def test_autocast_asked_for_float32_is_no_finding(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # nanoGPT with --dtype=float32 on a GPU: autocast(dtype=float32) lowers nothing, on purpose.
    import torch

    import torchdoctor

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torchdoctor.Session(tmp_path / "run", quiet=True):
        for _ in range(5):
            with torch.autocast("cuda", dtype=torch.float32):
                loss = model(torch.randn(4, 8, device="cuda")).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    found = cli("diagnoses", str(tmp_path / "run"), "--format", "json").stdout
    assert "autocast_unused" not in found, found
