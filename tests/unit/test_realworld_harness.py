"""The real-world scorecard's harness (benchmarks/realworld.py): its judgements on made-up
runs, its definitions, and its behaviour without the cache of fetched programs. The programs
themselves run only in the benchmark (`make realworld`, ~15 min), never here."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

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


def test_place_is_a_module_or_a_line(harness: ModuleType) -> None:
    d = {"location": "transformer.h.0.mlp", "summary": "torch.log at /w/model.py:89 produced"}
    assert harness.right_place(d, ("transformer.h.0.mlp",), [])
    assert not harness.right_place(d, ("mlp",), [])  # the last component alone is not it
    assert harness.right_place(d, (), ["model.py:89"])
    assert not harness.right_place(d, (), ["model.py:8"])
    assert not harness.right_place({"location": None, "summary": ""}, ("fc1",), ["main.py:3"])


def test_fixes_are_read_from_both_shapes(harness: ModuleType) -> None:
    assert harness.fixes({"fix": "lower the lr\nclip"}) == ["lower the lr", "clip"]
    assert harness.fixes({"fix": ["lower the lr"]}) == ["lower the lr"]
    assert harness.fixes({}) == []


def test_definitions_are_consistent(harness: ModuleType) -> None:
    from realworld.bugs import BUGS
    from realworld.live import LIVE, OVERFIT
    from realworld.programs import PROGRAMS

    names = [p.name for p in PROGRAMS]
    assert len(names) == len(set(names)) and len(names) >= 8
    assert all(re.fullmatch(r"[0-9a-f]{40}", p.commit) for p in PROGRAMS)
    assert {b.program for b in BUGS} <= set(names)
    assert {c.program for c in (*LIVE, *OVERFIT)} <= set(names)
    kinds = {b.kinds for b in BUGS}
    assert len(kinds) >= 6, "at least 6 kinds of planted bugs"
    for bug in BUGS:
        assert bug.fix and (bug.modules or bug.lines), bug.name
        re.compile(bug.fix)


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


def test_every_patch_matches_its_cached_program(harness: ModuleType) -> None:
    from realworld.bugs import BUGS
    from realworld.programs import by_name

    checked = 0
    for bug in BUGS:
        program = by_name(bug.program)
        source = harness.cached(harness.CACHE, program)
        if source is None:
            continue
        for patch in (*program.port, *bug.patches):
            text = (source / patch.file).read_text()
            assert text.count(patch.old) == 1, (bug.name, patch.file)
        checked += 1
    if not checked:
        pytest.skip("the real-world cache is not here (make realworld-populate)")
