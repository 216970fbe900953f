"""The C++ collectives kernel's build and load rules (torchdoctor/native), and the journal's
reading back of what another writer appends (store/journal.py: JournalTable.follow). The
kernel's rows themselves are checked on real torchrun jobs (tests/integration/
test_collectives.py runs every case with both kernels)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor import native
from torchdoctor.store import journal
from torchdoctor.store.schema import COLLECTIVES


def test_make_test_built_the_kernel() -> None:
    assert native.built() is not None, "python -m torchdoctor.native"


def test_without_a_compiler_the_build_says_so(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCHDOCTOR_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, c++ or clang++ on it
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(native.BuildError, match="no C\\+\\+ compiler"):
        native.build()
    assert native.built() is None


def test_a_library_others_may_write_is_not_loaded(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ours = native.built()
    assert ours is not None
    monkeypatch.setenv("TORCHDOCTOR_NATIVE_DIR", str(tmp_path / "cache"))
    target = native.library_path()
    target.parent.mkdir(parents=True, mode=0o700)
    shutil.copy(ours, target)
    assert native.built() == target
    target.parent.chmod(0o777)  # anyone could have put it there
    assert native.built() is None
    target.parent.chmod(0o700)
    target.chmod(0o666)
    assert native.built() is None


def test_the_cpp_kernel_where_built_unless_turned_off() -> None:
    code = "import torch, torchdoctor.native as n;print(n.load() is None)"
    assert native.built() is not None, "make test builds it: python -m torchdoctor.native"
    for setting, expected in (("0", "True"), ("", "False"), ("1", "False")):
        env = dict(os.environ, TORCHDOCTOR_NATIVE=setting)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.strip() == expected, out.stderr


def _row(rid: int, seq: int) -> bytes:
    return (
        f'I [{rid},0,"default",{seq},"all_reduce","[[4]]","float32",16,null,1.5,null,'
        f'"issued","train.py:9",0]\n'
    ).encode()


def test_a_followed_journal_is_read_back_line_by_line(tmp_path: Path) -> None:
    table = journal.JournalTable(COLLECTIVES)
    table.attach(lambda: tmp_path)
    closed: list[bool] = []
    path = table.follow(lambda: closed.append(True))
    assert path == journal.path_of(tmp_path, COLLECTIVES) and path.parent.is_dir()
    first = _row(0, 0)
    with open(path, "ab") as f:  # the other writer, half a line at a time
        f.write(first[:30])
        f.flush()
        table.catch_up()
        assert len(table) == 0  # a line not yet whole is not read
        f.write(first[30:] + _row(1, 1) + b'E [0,0.25,"completed"]\n')
        f.flush()
    by_seq = {r["seq"]: r for r in table.snapshot().to_records()}
    assert (by_seq[0]["state"], by_seq[0]["duration"]) == ("completed", 0.25)
    assert (by_seq[1]["state"], by_seq[1]["duration"]) == ("issued", None)
    table.close()
    assert closed == [True]
    # what the saved run reads is the same
    saved, truncated = journal.read(path, COLLECTIVES)
    assert not truncated and sorted(saved.column("seq")) == [0, 1]
