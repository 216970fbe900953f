"""The CUDA paths, on a real GPU (skipped without one): no host sync in the hot path, and a
float16 overflow under autocast found and localized."""

from __future__ import annotations

import json

import pytest
from helpers import cli, script, td_run

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("trace_every", ["0", "1", "20"])
def test_hot_path_makes_no_host_sync(launch, tmp_path, trace_every) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "run"
    run = launch(
        td_run("--run-dir", str(d), "--trace-every", trace_every, script("cuda_no_sync.py"))
    )
    assert run.wait(180) == 0, run.output()
    assert "no sync" in run.stdout()
    out = cli(
        "query",
        str(d),
        "SELECT count(*) AS n, count(loss) AS losses FROM python.steps",
        "--format",
        "json",
    )
    rows = json.loads(out.stdout)[0]
    assert rows["n"] == 40 and rows["losses"] == 40  # every row read back, asynchronously


def test_fp16_overflow_under_autocast_is_found(launch, tmp_path) -> None:
    d = tmp_path / "run"
    run = launch(
        td_run(
            "--guard",
            "--quiet",
            "--run-dir",
            str(d),
            script("diag_fp16_overflow.py"),
            "--device",
            "cuda",
        )
    )
    assert run.wait(180) == 0, run.output()
    found = [json.loads(line) for line in (d / "diagnoses.jsonl").read_text().splitlines()]
    nan = next(f for f in found if f["kind"] == "nan")
    assert nan["step"] == 8 and nan["location"] == "proj"
    assert nan["evidence"]["stage"] == "forward" and nan["evidence"]["dtype"] == "float16"
    assert nan["evidence"]["causes"][0]["cause"].startswith("float16 overflow")


def test_fp16_overflow_without_guard_is_still_named(launch, tmp_path) -> None:
    # The check is read back a step late on CUDA: the update has happened. The localizer arms
    # a synchronous check and names the module whose weights went non-finite.
    d = tmp_path / "run"
    run = launch(
        td_run("--quiet", "--run-dir", str(d), script("diag_fp16_overflow.py"), "--device", "cuda")
    )
    assert run.wait(180) == 0, run.output()
    found = [json.loads(line) for line in (d / "diagnoses.jsonl").read_text().splitlines()]
    nan = next(f for f in found if f["kind"] == "nan")
    assert nan["location"] in {"proj", "body.1", "head"}
