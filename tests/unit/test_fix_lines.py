"""A crash's fix as a diagnosis gives: one line of code on its title's line, a block whole on
the lines after it; a fix holding a newline stays one fix wherever it is read back; brief
outputs never end a code block at its header."""

from __future__ import annotations

from torchdoctor.diagnose.crash import CrashEvidence, from_evidence
from torchdoctor.diagnose.record import Diagnosis, Finding
from torchdoctor.errors.catalog import entries
from torchdoctor.report.diagnoses import render_full
from torchdoctor.report.explanation import code_lines
from torchdoctor.store.schema import split_fixes


def test_a_crash_fix_is_not_cut_after_its_block_header() -> None:
    evidence = CrashEvidence(
        exception="RuntimeError",
        message="mat1 and mat2 shapes cannot be multiplied (4x800 and 512x10)",
        category="shape.matmul",
        title="shapes",
        explanation="x",
        fixes=[
            {
                "title": "Compute the flatten size from a dummy input",
                "code": "with torch.no_grad():\n    n = self.features(torch.zeros(1, 3)).shape[1]",
            },
            {
                "title": "Update by hand under no_grad",
                "code": "with torch.no_grad():\n    for p in ps:\n        p -= lr * p.grad",
            },
        ],
    )
    d = from_evidence(evidence)
    assert d.fix[0] == (
        "Compute the flatten size from a dummy input:\n"
        "with torch.no_grad():\n    n = self.features(torch.zeros(1, 3)).shape[1]"
    )
    assert d.fix[1] == (
        "Update by hand under no_grad:\nwith torch.no_grad():\n    for p in ps:\n"
        "        p -= lr * p.grad"
    )
    text = render_full([Finding.of(d)])
    assert "  2. Update by hand under no_grad:\n       with torch.no_grad():\n" in text
    assert "           p -= lr * p.grad" in text


def test_a_fix_with_a_newline_stays_one_fix() -> None:
    d = Diagnosis("nan", "error", "s", fix=["first\n  second", "third"])
    assert split_fixes(d.row()[8]) == ["first\n  second", "third"]  # the fix column read back


def test_brief_code_is_whole_or_says_what_is_left() -> None:
    codes = [c for e in entries() for f in e.fixes for c in _texts(f.code)]
    longest = max(codes, key=lambda c: c.count("\n"))
    assert code_lines(longest, "  ") == ["  " + line for line in longest.splitlines()]
    cut = code_lines("\n".join(f"x{i} = {i}" for i in range(20)), "", limit=12)
    assert cut[-1] == "# ... 8 more lines: `torchdoctor explain`"


def _texts(text: str | tuple[str, ...]) -> tuple[str, ...]:
    return (text,) if isinstance(text, str) else text
