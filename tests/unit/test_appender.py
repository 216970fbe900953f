"""The write-through journal's file (store/appender.py): records on disk the moment they are
written, through an abort; the NUL padding of a mapped file never read as a record."""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchdoctor.store import appender, journal
from torchdoctor.store.schema import COLLECTIVES
from torchdoctor.store.tables import Tables


def _collective(seq: int) -> tuple:
    return (1, "default", seq, "all_reduce", "[[4]]", "float32", 16, None, 1.0e9 + seq, None,
            "issued", "train.py:9", 0)  # fmt: skip


def test_records_cross_chunks_and_the_padding_goes_at_close(tmp_path: Path) -> None:
    path = tmp_path / "t.log"
    out = appender.open_appender(path)
    assert isinstance(out, appender.MappedAppender)  # this machine has shared maps
    line = b"x" * 99 + b"\n"
    count = appender.CHUNK // len(line) + 10  # past the first chunk
    for _ in range(count):
        out.write(line)
    # Live, before close: what a reader in another process sees is every record, then NULs.
    data = path.read_bytes()
    assert len(data) == 2 * appender.CHUNK and data.endswith(b"\0")
    assert appender.records(data) == line * count
    big = bytes(range(256)) * (5 * appender.CHUNK // 512)  # one write over two chunks
    out.write(big)
    assert len(out._map) == appender.CHUNK  # only the last chunk is mapped (resident)
    out.close()
    out.write(b"late")  # after close: dropped
    assert path.read_bytes() == line * count + big  # trimmed
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_reopening_a_file_left_padded_appends_after_its_records(tmp_path: Path) -> None:
    path = tmp_path / "t.log"
    path.write_bytes(b"one\n" + b"\0" * 5000)  # a run that was killed: never trimmed
    out = appender.open_appender(path)
    out.write(b"two\n")
    out.close()
    assert path.read_bytes() == b"one\ntwo\n"


def test_the_plain_fallback_appends_as_well(tmp_path: Path) -> None:
    path = tmp_path / "t.log"
    out = appender.PlainAppender(path)
    out.write(b"one\n")
    out.write(b"two\n")
    out.close()
    out.write(b"late\n")  # after close: dropped, not an error
    assert path.read_bytes() == b"one\ntwo\n"


@pytest.mark.parametrize("end", ["abort", "kill"])
def test_records_written_before_an_abort_are_read_back(tmp_path: Path, end: str) -> None:
    """A rank that gloo aborts (SIGABRT) or that is killed runs no more Python: the rows it
    wrote, and the ends written before them, are all that is left."""
    run = tmp_path / "run"
    code = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from torchdoctor.store.tables import Tables
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_appender import _collective
        journal = Tables()["collectives"]
        journal.attach(lambda: Path({str(run)!r}))
        for seq in range(3):
            rid = journal.issue(_collective(seq))
            journal.end(rid, None, "completed")  # written with the next issued row
        os.kill(os.getpid(), signal.{"SIGABRT" if end == "abort" else "SIGKILL"})
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == -(signal.SIGABRT if end == "abort" else signal.SIGKILL)
    path = journal.path_of(run, COLLECTIVES)
    assert path.read_bytes().endswith(b"\0")  # not trimmed: nothing ran after the signal
    block, truncated = journal.read(path, COLLECTIVES)
    assert not truncated  # the padding is not a line cut short
    states = [(r["seq"], r["state"]) for r in block.to_records()]
    # the last end waited for a next row (or the spill thread's next second) that never came
    assert states == [(0, "completed"), (1, "completed"), (2, "issued")]


def test_a_line_cut_short_is_flagged_and_skipped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    table = Tables()["collectives"]
    table.attach(lambda: run)
    table.issue(_collective(0))
    table.close()
    path = journal.path_of(run, COLLECTIVES)
    with open(path, "ab") as f:
        f.write(b'I [1,1,"default",1,"all_re' + b"\0" * 100)  # a store cut by the kill
    block, truncated = journal.read(path, COLLECTIVES)
    assert truncated and [r["seq"] for r in block.to_records()] == [0]


def test_a_file_that_cannot_grow_is_a_counted_error_never_a_crash(tmp_path: Path) -> None:
    """Blocks are reserved before they are mapped: where they cannot be (here a file size
    limit stands in for a full disk), the write fails with an OSError that the journal counts,
    and the training goes on, never a SIGBUS."""
    run = tmp_path / "run"
    code = textwrap.dedent(f"""
        import resource, signal, sys
        from pathlib import Path
        from torchdoctor.store import appender
        from torchdoctor.store.tables import Tables
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_appender import _collective
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the limit's error, not its signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (appender.CHUNK + 4096,) * 2)
        journal = Tables()["collectives"]
        journal.attach(lambda: Path({str(run)!r}))
        for seq in range(2 * appender.CHUNK // 150):
            journal.issue(_collective(seq))
        assert type(journal._file) is appender.MappedAppender
        print(journal.write_errors, len(journal))
        journal.close()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    errors, rows = map(int, proc.stdout.split())
    assert errors > 0 and rows == 2 * appender.CHUNK // 150  # every row still queryable live
    block, truncated = journal.read(journal.path_of(run, COLLECTIVES), COLLECTIVES)
    assert not truncated and block.rows == rows - errors  # the first chunk's, all whole
