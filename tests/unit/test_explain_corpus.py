"""`torchdoctor explain` held to its figures on real error texts (tests/fixtures/explain_corpus:
texts from public issue threads, benchmarks/explain_corpus.py scores them). The held-out part
is never used to tune the catalog; these tests keep a change from making it worse."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from torchdoctor.errors.catalog import by_code

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import explain_corpus  # noqa: E402

# The bars (docs/explain.md): on the held-out texts.
CATEGORY_RATE = 0.95
FIX_RATE = 0.80
MIN_TEXTS = 300


@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    return explain_corpus.measure()


def test_the_corpus_is_well_formed() -> None:
    cases = explain_corpus.cases()
    assert len(cases) >= MIN_TEXTS
    seen = set()
    for case in cases:
        key = (case.source, case.text.strip())
        assert case.source.startswith("https://"), case.name
        # The split is the source's, fixed before any tuning: a text cannot move.
        assert case.split == explain_corpus.split_of(case.source), case.name
        assert case.category == "none" or by_code(case.category) is not None, case.name
        assert (case.fix is None) == (case.fix_check is None), case.name
        if case.fix_check:
            re.compile(case.fix_check)
        assert case.text.strip(), case.name
        assert key not in seen, f"{case.name}: the same text of the same thread twice"
        seen.add(key)
    splits = {c.split for c in cases}
    assert splits == {"dev", "heldout"}


def test_the_held_out_figures_meet_the_bars(measured: dict[str, Any]) -> None:
    figures, verdicts = measured["heldout"]
    wrong = [v.case.name for v in verdicts if v.confident_wrong]
    assert not wrong, f"a category named with confidence is wrong: {wrong}"
    assert figures.category_rate >= CATEGORY_RATE, figures.line("heldout")
    assert figures.with_fix >= 30
    assert figures.fix_rate >= FIX_RATE, figures.line("heldout")


def test_the_held_out_texts_not_in_dev_meet_them_too(measured: dict[str, Any]) -> None:
    figures, verdicts = measured["unseen"]
    assert not [v.case.name for v in verdicts if v.confident_wrong]
    assert figures.category_rate >= CATEGORY_RATE, figures.line("unseen")
    assert figures.fix_rate >= FIX_RATE, figures.line("unseen")


def test_the_dev_figures_hold(measured: dict[str, Any]) -> None:
    figures, verdicts = measured["dev"]
    assert not [v.case.name for v in verdicts if v.confident_wrong]
    assert figures.category_rate >= CATEGORY_RATE, figures.line("dev")
    assert figures.fix_rate >= FIX_RATE, figures.line("dev")


def test_the_docs_show_the_figures(measured: dict[str, Any]) -> None:
    """docs/explain.md states both parts' figures as the scorer prints them."""
    text = (ROOT / "docs" / "explain.md").read_text(encoding="utf-8")
    for split in ("dev", "heldout", "unseen"):
        figures, _v = measured[split]
        assert figures.line(split) in text, figures.line(split)
