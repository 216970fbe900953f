"""Whole torchrun logs in `torchdoctor explain`: the launcher's lines and summary, rank groups,
the root failure, and where the answer came from (rank, line). The logs are real: captured
from 2-rank gloo jobs of tests/scripts/dist_rank_fails.py (the fixtures torchrun_*.txt) or
excerpts of public issues; tests/integration/test_explain_torchrun.py runs such a job live."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from torchdoctor.errors import extract, torchrun
from torchdoctor.errors.api import explain_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "explain"


def _text(path: Path) -> str:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("# "))


def test_summary_entries_are_parsed() -> None:
    lines = extract.clean(_text(FIXTURES / "oom.cuda" / "torchrun_record_summary.txt"))
    job = torchrun.parse(lines)
    assert job is not None
    assert job.ranks == [1, 0]  # rank 1 wrote first
    by_rank = {f.rank: f for f in job.failures}
    assert set(by_rank) == {0, 1}
    root = job.root_failure
    assert root is not None and root.rank == 1 and root.exitcode == 1 and root.root
    assert root.host == "localhost" and root.signal is None
    # @record put the rank's traceback into the summary: its lines are the entry's.
    said = " ".join(lines[i].text for i in root.traceback)
    assert "CUDA out of memory" in said
    assert by_rank[0].exitcode == -15 and by_rank[0].signal == "SIGTERM"
    # Everything of the launcher is set apart: its records, traceback and summary.
    for i in job.launcher:
        assert not lines[i].raw.startswith("[rank"), lines[i].raw
    assert any("ChildFailedError" in lines[i].text for i in job.launcher)


def test_a_plain_traceback_is_not_a_job() -> None:
    text = 'Traceback (most recent call last):\n  File "t.py", line 1\nValueError: x\n'
    assert torchrun.parse(extract.clean(text)) is None


def test_consequences_do_not_hide_an_unrecognised_root() -> None:
    # Before: the answer was rank 0's "Connection closed by peer" (a consequence).
    e = explain_text(_text(FIXTURES / "unknown" / "torchrun_keyerror.txt"))
    assert not e.recognised and e.rank == 1 and e.exception == "KeyError"
    assert [(a["category"], a["rank"]) for a in e.also] == [("dist.peer_lost", 0)]


def test_glued_progress_bar() -> None:
    # A tqdm bar redrawn with \r, pasted into an issue, ends up glued to the next rank's line
    # (https://github.com/hiyouga/LlamaFactory/issues/4856, excerpt).
    line = "  0%|          | 0/3100 [00:00<?, ?it/s][rank1]: Traceback (most recent call last):"
    (got,) = extract.clean(line)
    assert (got.text, got.rank) == ("Traceback (most recent call last):", 1)


def test_json_and_text_say_where() -> None:
    path = FIXTURES / "shape.matmul" / "torchrun_rank1.txt"
    log = _text(path)
    cmd = [sys.executable, "-m", "torchdoctor", "explain", "--format", "json"]
    out = subprocess.run(cmd, input=log, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert (data["category"], data["rank"], data["line"]) == ("shape.matmul", 1, 20)
    assert log.splitlines()[data["line"] - 1].startswith("[rank1]: RuntimeError: mat1 and mat2")
    assert data["also"][0]["rank"] == 0 and data["also"][0]["line_number"] == 31
    out = subprocess.run(cmd[:-2], input=log, capture_output=True, text=True, timeout=60)
    assert "(from rank 1, line 20)" in out.stdout


# --- a rank that gloo aborts: no traceback, no prefix (fixtures from dist_rank_fails.py sizes) --

ABORT = FIXTURES / "dist.collective_mismatch" / "torchrun_gloo_abort.txt"


def test_the_signalled_root_is_known() -> None:
    lines = extract.clean(_text(ABORT))
    job = torchrun.parse(lines)
    assert job is not None and job.ranks == [1]  # rank 0 wrote no prefixed line at all
    root = job.signalled_root
    assert root is not None and (root.rank, root.exitcode, root.signal) == (0, -6, "SIGABRT")
    what = next(line for line in lines if line.text.lstrip().startswith("what():"))
    assert torchrun.aborted_with(lines, what.index) == "gloo::EnforceNotMet"
    # A rank the launcher ended itself (SIGTERM) is never the signalled root.
    keyerror = torchrun.parse(extract.clean(_text(FIXTURES / "unknown" / "torchrun_keyerror.txt")))
    assert keyerror is not None and keyerror.signalled_root is None


def _moved_first(text: str, rank: int) -> str:
    """The same log with `rank`'s lines printed before everything else: the order in which
    the ranks' stderr reaches the terminal is not fixed."""
    prefix = f"[rank{rank}]:"
    lines = text.splitlines(keepends=True)
    return "".join(
        [x for x in lines if x.startswith(prefix)] + [x for x in lines if not x.startswith(prefix)]
    )


def test_the_aborted_rank_is_the_root_wherever_its_lines_fall() -> None:
    text = _text(ABORT)
    e = explain_text(text)
    assert (e.category, e.rank) == ("dist.collective_mismatch", 0)
    assert text.splitlines()[e.line - 1].lstrip().startswith("what():")
    assert (e.fields["signal"], e.fields["exitcode"]) == ("SIGABRT", -6)
    assert [(a["category"], a["rank"]) for a in e.also] == [("dist.peer_lost", 1)]
    # Rank 1's "Connection reset by peer" first in the log: still a consequence.
    moved = _moved_first(text, 1)
    e = explain_text(moved)
    assert (e.category, e.rank) == ("dist.collective_mismatch", 0)
    assert moved.splitlines()[e.line - 1].lstrip().startswith("what():")


def test_an_abort_outside_the_catalog_is_still_the_root() -> None:
    # The real log with gloo's what() message replaced by one no entry knows: the answer is
    # rank 0's abort, unrecognised, not rank 1's lost connection.
    text = _text(ABORT)
    start = text.index("[enforce fail")
    end = text.index("\n", start)
    e = explain_text(text[:start] + "[enforce fail at x.cc:1] frobnicator broken." + text[end:])
    assert not e.recognised and e.rank == 0 and e.exception == "gloo::EnforceNotMet"
    assert "frobnicator broken" in (e.matched or "")
    assert [(a["category"], a["rank"]) for a in e.also] == [("dist.peer_lost", 1)]


def test_faulthandler_gives_the_aborted_rank_its_line() -> None:
    # Under @record faulthandler dumps the aborted rank's Python stack (most recent first).
    e = explain_text(
        _text(FIXTURES / "dist.collective_mismatch" / "torchrun_gloo_abort_record.txt")
    )
    assert e.rank == 0 and e.fields["location"].endswith("dist_rank_fails.py:53 in main")


def test_faulthandler_location_is_the_main_threads() -> None:
    # With other Python threads (a prefetcher in the user's code) faulthandler lists them
    # too; the location is the main thread's, the one that reaches <module>.
    text = _text(FIXTURES / "dist.collective_mismatch" / "torchrun_gloo_abort_record.txt")
    at = text.index("Thread 0x")
    extra = (
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/job/prefetch.py", line 9 in run\n\n'
    )
    e = explain_text(text[:at] + extra + text[at:])
    assert e.rank == 0 and e.fields["location"].endswith("dist_rank_fails.py:53 in main")
