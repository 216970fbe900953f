"""Docs generated from code stay in step with it; every verb and kind is documented."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from torchdoctor.cli.main import COMMANDS
from torchdoctor.diagnose import MODULES
from torchdoctor.report.schema_doc import render_markdown

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"


def test_tables_doc_is_current() -> None:
    path = DOCS / "tables.md"
    expected = render_markdown()
    if os.environ.get("TORCHDOCTOR_UPDATE_DOCS"):
        path.write_text(expected)
    if not path.exists() or path.read_text() != expected:
        pytest.fail("docs/tables.md is stale: rerun with TORCHDOCTOR_UPDATE_DOCS=1")


def test_every_verb_is_in_the_cli_doc() -> None:
    text = (DOCS / "cli.md").read_text()
    for verb in COMMANDS:
        assert re.search(rf"torchdoctor (ENDPOINT |PID )?{re.escape(verb)}\b", text), verb


def test_every_diagnosis_kind_is_documented() -> None:
    text = (DOCS / "diagnoses.md").read_text()
    kinds = {"exploding_gradients", "vanishing_gradients"} | set(MODULES)
    for kind in kinds:
        assert f"`{kind}`" in text, kind
