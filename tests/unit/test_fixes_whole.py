"""Every fix is shown whole, wherever it is shown: each fix of the error catalog (the explain
block after a crash, the crash diagnosis made of it, its alert and its saved row) and each fix
of the diagnoses of the saved runs of real scripts (the alert, `torchdoctor diagnoses`, the
python.diagnoses column read back). A fix whose code is a block is never cut after its first
line (`with torch.no_grad():` alone says nothing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchdoctor.config import Config
from torchdoctor.diagnose import load_modules
from torchdoctor.diagnose.crash import CrashEvidence, from_evidence
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis, Finding
from torchdoctor.errors.api import explain_text
from torchdoctor.errors.catalog import entries
from torchdoctor.report.alerts import render_alert
from torchdoctor.report.crash import render_crash
from torchdoctor.report.diagnoses import render_full
from torchdoctor.report.explanation import MAX_FIXES, render_text
from torchdoctor.store.saved import open_run
from torchdoctor.store.schema import DIAGNOSES, join_fixes, split_fixes

RUNS = Path(__file__).resolve().parent.parent / "fixtures" / "runs"


def _code_lines(fix: dict[str, str]) -> list[str]:
    return [line.strip() for line in fix["code"].splitlines() if line.strip()]


def _shown(text: str, lines: list[str]) -> list[str]:
    """The lines of `lines` missing from `text`: each must end a line of it (a code line on
    its own, or after its fix's title), indentation aside."""
    shown = [line.rstrip() for line in text.splitlines()]
    return [line for line in lines if not any(s.endswith(line) for s in shown)]


def _explained() -> list[tuple[str, object]]:
    out = []
    for entry in entries():
        for example in entry.examples[:1]:
            explanation = explain_text(example)
            if explanation.recognised and explanation.fixes:
                out.append((entry.code, explanation))
    return out


EXPLAINED = _explained()


def test_the_catalog_has_fixes_with_code_blocks() -> None:
    assert len(EXPLAINED) > 50
    blocks = [f for _c, e in EXPLAINED for f in e.fixes if len(_code_lines(f)) > 1]  # type: ignore[attr-defined]
    assert len(blocks) > 20  # what this file is about: fixes of several lines


@pytest.mark.parametrize("code,explanation", EXPLAINED, ids=[c for c, _e in EXPLAINED])
def test_catalog_fixes_are_shown_whole(code: str, explanation: object) -> None:
    e = explanation
    fixes = e.fixes  # type: ignore[attr-defined]
    assert not _shown(render_text(e, brief=True), _code_lines(fixes[0]))
    full = render_text(e)
    for fix in fixes[:MAX_FIXES]:
        assert not _shown(full, _code_lines(fix)), fix
    # the crash of a run, explained after its traceback, and its diagnosis
    evidence = CrashEvidence(
        exception="RuntimeError",
        message="m",
        category=code,
        title=e.title,  # type: ignore[attr-defined]
        explanation=e.summary,  # type: ignore[attr-defined]
        fixes=list(fixes),
    )
    assert not _shown(render_crash(evidence), _code_lines(fixes[0]))
    diagnosis = from_evidence(evidence)
    alert = render_alert(diagnosis, fixes=len(diagnosis.fix))
    for fix in fixes:
        code_lines = [x for x in _code_lines(fix) if not x.startswith("#")]
        assert not _shown(alert, code_lines), (fix, alert)
    assert split_fixes(join_fixes(diagnosis.fix)) == diagnosis.fix


def _diagnosed() -> list[Diagnosis]:
    found = []
    for run_dir in sorted(p for p in RUNS.iterdir() if (p / "meta.json").is_file()):
        run = open_run(run_dir)
        inputs = Inputs.of_saved(run, Config())
        found += [d for module in load_modules() for d in module.diagnose(inputs)]
    return found


def test_diagnosis_fixes_are_shown_whole() -> None:
    found = _diagnosed()
    assert len({d.kind for d in found}) >= 8
    for d in found:
        assert d.fix, d
        alert = render_alert(d, fixes=len(d.fix))
        rows = render_full([Finding.of(d)])
        for fix in d.fix:
            lines = [line.strip() for line in fix.splitlines()]
            assert not _shown(alert, lines), (fix, alert)
            assert not _shown(rows, lines), (fix, rows)
        assert split_fixes(join_fixes(d.fix)) == d.fix


_COLUMNS = DIAGNOSES.column_names
