"""A probe attached to a running process says so wherever its steps are shown: its steps count
from the attach, and the ones before it were not seen (meta.json, the registry entry and
/v1/status, `list`, the report's header)."""

from __future__ import annotations

import json
from pathlib import Path

import torchdoctor
from torchdoctor import registry
from torchdoctor.cli import processes
from torchdoctor.report.html import _meta_line


def test_an_attached_probe_says_its_steps_count_from_the_attach(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCHDOCTOR_SOCKET_DIR", str(tmp_path / "s"))
    with torchdoctor.Session(tmp_path / "run", quiet=True) as session:
        assert session.status()["attached"] is None
        session.note_attached()  # what `torchdoctor attach` runs in the target
        meta = json.loads((Path(session.run_dir) / "meta.json").read_text())
        entry = registry.find(session.pid)
        status = session.status()
    assert meta["attached"].startswith(meta["started"][:10])
    assert entry is not None and entry["attached"] == status["attached"] > 0
    status.update(state="stepping", last_step=12)
    assert processes.state(status) == "step 12 since the attach"
    header = _meta_line("run", meta, [0])
    assert (
        f'attached at <span class="words">{meta["attached"].replace("T", " ")[:19]}</span>'
        in header
    )
    assert "step 0 is the first step after it; the steps before it were not seen" in header
