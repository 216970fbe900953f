"""The real-world scorecard's harness (benchmarks/realworld.py): its judgements on made-up
runs, its definitions, and its behaviour without the cache of fetched programs. The programs
themselves run only in the benchmark (`make realworld`, ~20 min), never here."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "realworld_harness", ROOT / "benchmarks" / "realworld.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["realworld_harness"] = module
    spec.loader.exec_module(module)
    return module


def test_torchdoctor_lines_are_told_from_the_programs(harness: ModuleType) -> None:
    stderr = "\n".join(
        [
            "warning: the program's own",
            "torchdoctor: probing pid 1; run directory /tmp/x",
            "torchdoctor WARNING [not_learning] at step 99",
            "  The loss is not going down",
            "  -> check the learning rate",
            "  an indented line of the program after one of its own",
            "",
            "torchdoctor summary",
            "  30 steps in 8.4 s (278.9 ms/step)",
            "  no problems found",
        ]
    )
    ours, theirs = harness.split_stderr(stderr)
    assert theirs == ["warning: the program's own"]
    assert ours[0].startswith("torchdoctor: probing") and ours[-1] == "  no problems found"
    assert "" in ours  # the blank line the summary starts with


def test_internal_failures_are_counted(harness: ModuleType) -> None:
    clean = "torchdoctor: probing pid 1\n\ntorchdoctor summary\n  no problems found\n"
    assert harness.internal_failures(clean) == []
    failed = (
        "torchdoctor: torchdoctor telemetry failed (TypeError: x) and was switched off; "
        "the training goes on\n"
    )
    assert len(harness.internal_failures(failed)) == 1
    ours_in_theirs = (
        "Traceback (most recent call last):\n"
        '  File "/x/src/torchdoctor/telemetry/torch_hooks.py", line 59, in backward\n'
        "RuntimeError: boom\n"
    )
    assert harness.internal_failures(ours_in_theirs)
    # A program that prints "could not" itself is not torchdoctor failing.
    assert harness.internal_failures("could not open the cache, using defaults\n") == []
    # Nor is a diagnosis that says what it could not find about the program; a failure of
    # its own after the alert still counts.
    alert = (
        "torchdoctor ERROR [nan] at step 0\n"
        "  Step 0 went non-finite; the origin could not be found (not replayed)\n"
        "  -> add warm-up\n"
    )
    assert harness.internal_failures(alert) == []
    assert len(harness.internal_failures(alert + failed)) == 1


def test_only_the_programs_timing_fields_are_normalised(harness: ModuleType) -> None:
    timing = (r"time [\d.]+ms", r"mfu -?[\d.]+%", r"━+")
    a = "iter 3: loss 2.5012, time 41.20ms, mfu -100.00% ━━━━ 3/3"
    b = "iter 3: loss 2.5012, time 39.87ms, mfu 1.25% ━━━━━━ 3/3"
    assert harness.normalise(a, timing) == harness.normalise(b, timing)
    padded = (r"time:\s+[\d.]+s",)
    assert harness.normalise("| time:  9.99s |", padded) == harness.normalise(
        "| time: 10.05s |", padded
    )
    c = "iter 3: loss 2.5013, time 39.87ms, mfu 1.25% ━━━━━━ 3/3"
    assert harness.normalise(a, timing) != harness.normalise(c, timing)  # the loss is not


def test_a_torchrun_jobs_outputs_are_compared_as_line_sets(harness: ModuleType) -> None:
    from realworld.programs import by_name

    job, single = by_name("tensor_parallel"), by_name("mnist")
    assert job.ranks == 2 and single.ranks == 0
    a = "Starting on rank 1.\nStarting on rank 0.\n11/26/2026 05:06:37 AM  iter 0 completed\n"
    b = "Starting on rank 0.\n11/26/2026 05:07:02 AM  iter 0 completed\nStarting on rank 1.\n"
    assert harness.comparable(a, job) == harness.comparable(b, job)
    assert harness.comparable(a, job) != harness.comparable(a + "Starting on rank 1.\n", job)
    # torch's own log lines, as the transparency tests read them: no time, no pid.
    w1 = "W1126 05:04:41.123456 4242 torch/distributed/run.py:792] Setting OMP_NUM_THREADS\n"
    w2 = "W1126 05:09:12.654321 77 torch/distributed/run.py:792] Setting OMP_NUM_THREADS\n"
    assert harness.comparable(w1, single) == harness.comparable(w2, single)
    assert harness.comparable(a, single) != harness.comparable(b, single)  # order counts


def test_a_time_in_a_files_path_is_unstable(harness: ModuleType, tmp_path: Path) -> None:
    from realworld.programs import by_name

    names = by_name("fsdp2").unstable_names
    for run, stamp in (("a", "1795669898475"), ("b", "1795669912345")):
        folder = tmp_path / run / "distributed/FSDP2/checkpoints/dtensor_api" / stamp
        folder.mkdir(parents=True)
        (folder / "model_state_dict.pt").write_bytes(b"weights")
    a, b = harness.files_of(tmp_path / "a", names), harness.files_of(tmp_path / "b", names)
    assert a == b and list(a) == [
        "distributed/FSDP2/checkpoints/dtensor_api/<unstable>/model_state_dict.pt"
    ]
    (
        tmp_path / "b/distributed/FSDP2/checkpoints/dtensor_api/1795669912345/model_state_dict.pt"
    ).write_bytes(b"other")
    assert harness.files_of(tmp_path / "b", names) != a  # the bytes are still compared


def test_every_rank_must_record_every_step(harness: ModuleType) -> None:
    def job(by_rank: list[int]) -> Any:
        return harness.ProgramResult(
            "job",
            "ran",
            steps_expected=10,
            ranks=2,
            steps_by_rank=by_rank,
            steps_recorded=sum(by_rank),
        )

    assert job([10, 10]).steps_ok and job([10, 10]).steps_said.startswith("rank 0: 10, rank 1: 10")
    assert not job([20, 0]).steps_ok and "**NO**" in job([20, 0]).steps_said
    assert not job([10]).steps_ok  # a rank that recorded nothing at all


def test_place_is_a_module_or_a_line(harness: ModuleType) -> None:
    d = {"location": "transformer.h.0.mlp", "summary": "torch.log at /w/model.py:89 produced"}
    assert harness.right_place(d, ("transformer.h.0.mlp",), [])
    assert not harness.right_place(d, ("mlp",), [])  # the last component alone is not it
    assert harness.right_place(d, (), ["model.py:89"])
    assert not harness.right_place(d, (), ["model.py:8"])
    assert not harness.right_place({"location": None, "summary": ""}, ("fc1",), ["main.py:3"])
    w1 = {"location": "layers.0.feed_forward.w1", "summary": ""}
    assert harness.right_place(w1, ("layers.*",), [])  # any module under layers
    assert not harness.right_place({"location": "layers", "summary": ""}, ("layers.*",), [])
    assert not harness.right_place({"location": "output", "summary": ""}, ("layers.*",), [])


def test_fixes_are_read_from_both_shapes(harness: ModuleType) -> None:
    assert harness.fixes({"fix": "lower the lr\nclip"}) == ["lower the lr", "clip"]
    assert harness.fixes({"fix": ["lower the lr"]}) == ["lower the lr"]
    assert harness.fixes({}) == []


def test_definitions_are_consistent(harness: ModuleType) -> None:
    from realworld.bugs import BUGS, REAL_BUGS
    from realworld.live import LIVE, OVERFIT
    from realworld.programs import PROGRAMS

    names = [p.name for p in PROGRAMS]
    assert len(names) == len(set(names)) and len(names) >= 8
    assert all(re.fullmatch(r"[0-9a-f]{40}", p.commit) for p in PROGRAMS)
    assert {b.program for b in BUGS} <= set(names)
    assert {c.program for c in (*LIVE, *OVERFIT)} <= set(names)
    kinds = {b.kinds for b in BUGS}
    assert len(kinds) >= 6, "at least 6 kinds of planted bugs"
    for bug in (*BUGS, *REAL_BUGS):
        assert bug.fix and (bug.modules or bug.lines), bug.name
        re.compile(bug.fix)
    # A program's own bug is run as it is and fixed in its healthy runs: both are declared.
    for bug in REAL_BUGS:
        assert bug.program in names and not bug.patches, bug.name
        assert next(p for p in PROGRAMS if p.name == bug.program).fixes, bug.name


def test_without_the_cache_it_says_how_to_make_it(
    harness: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert harness.main(["--cache", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out and "--populate" in out
    assert not (tmp_path / "none").exists()


def test_patches_apply_exactly_once(harness: ModuleType, tmp_path: Path) -> None:
    from realworld.programs import Patch

    (tmp_path / "a.py").write_text("x = 1\ny = 2\n")
    harness.apply(tmp_path, (Patch("a.py", "y = 2\n", "y = 3\n"),))
    assert (tmp_path / "a.py").read_text() == "x = 1\ny = 3\n"
    with pytest.raises(ValueError, match="occurs 0x"):
        harness.apply(tmp_path, (Patch("a.py", "z = 1\n", ""),))


def test_every_patch_matches_its_cached_program(harness: ModuleType, tmp_path: Path) -> None:
    """The patches of every run, applied in their order (ports, the program's fixes but for
    its own bugs' runs, the bug's) to a copy of the files they change."""
    from realworld.bugs import BUGS, REAL_BUGS
    from realworld.programs import by_name

    checked = 0
    for bug, as_is in [*((b, False) for b in BUGS), *((b, True) for b in REAL_BUGS)]:
        program = by_name(bug.program)
        source = harness.cached(harness.CACHE, program)
        if source is None:
            continue
        patches = (program.port if as_is else program.healthy) + bug.patches
        copy = tmp_path / bug.name
        for name in {p.file for p in patches}:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_bytes((source / name).read_bytes())
        harness.apply(copy, patches)  # raises unless each patch's text occurs once
        checked += 1
    if not checked:
        pytest.skip("the real-world cache is not here (make realworld-populate)")


def test_told_first_is_the_head_of_the_story(harness: ModuleType, tmp_path: Path) -> None:
    # pytorch/examples' GCN with zero_grad() dropped: exploding gradients recorded first, then
    # the gradients never cleared found earlier in steps; once the story links them, the text
    # tells the cause first.
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "fixtures" / "runs" / "healthy_lr_schedule", run)

    def row(time: float, kind: str, step: int, follows: str | None = None) -> str:
        severity = "error" if kind == "grad_not_cleared" else "warning"
        return json.dumps(
            {"time": time, "step": step, "rank": 0, "kind": kind, "severity": severity,
             "summary": kind, "evidence": None, "fix": "", "follows": follows}
        )  # fmt: skip

    rows = [row(1.0, "exploding_gradients", 37), row(2.0, "grad_not_cleared", 2)]
    (run / "diagnoses.jsonl").write_text("\n".join(rows) + "\n")
    assert harness.told_first(run) == "exploding_gradients"  # apart: in the order found
    rows.append(row(3.0, "exploding_gradients", 37, follows="grad_not_cleared"))
    (run / "diagnoses.jsonl").write_text("\n".join(rows) + "\n")
    assert harness.told_first(run) == "grad_not_cleared"
    (run / "diagnoses.jsonl").write_text("")
    assert harness.told_first(run) is None
