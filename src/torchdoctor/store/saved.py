"""A finished (or killed) run read back from its directory, served with the same SQL."""

from __future__ import annotations

import json
from pathlib import Path

from torchdoctor.store import rundir
from torchdoctor.store.columns import Block
from torchdoctor.store.rotation import read_table
from torchdoctor.store.schema import BY_NAME, DIAGNOSES, STORED
from torchdoctor.store.tables import diagnosis_from_json


class RunNotFound(Exception):
    pass


class SavedRun:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not rundir.is_run_dir(self.path):
            raise RunNotFound(f"{self.path} is not a torchdoctor run directory")
        self.meta = rundir.read_meta(self.path)
        self.truncated: list[str] = []
        self._blocks: dict[str, Block] = {}

    def table_names(self) -> list[str]:
        return [spec.name for spec in STORED]

    def block(self, name: str) -> Block:
        if name not in self._blocks:
            self._blocks[name] = self._load(name)
        return self._blocks[name]

    def _load(self, name: str) -> Block:
        spec = BY_NAME[name]
        if name == DIAGNOSES.name:
            return Block.from_rows(spec, load_diagnoses(self.path))
        block, truncated = read_table(self.path / rundir.TABLES_DIR, spec)
        if truncated:
            self.truncated.append(name)
        return block


def load_diagnoses(run_dir: Path) -> list[tuple]:
    path = run_dir / rundir.DIAGNOSES_FILE
    rows: list[tuple] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            rows.append(diagnosis_from_json(json.loads(line)))
        except (ValueError, TypeError):
            continue  # a line cut short by a kill
    return rows
