"""A fix is one line of a diagnosis: code from the explain catalog is written on one line of
Python where it can be, and shown whole by `torchdoctor diagnoses` where it cannot; brief
outputs never end a code block at its header."""

from __future__ import annotations

from torchdoctor.diagnose.crash import CrashEvidence, from_evidence
from torchdoctor.diagnose.record import CODE_ELSEWHERE, Diagnosis, one_line
from torchdoctor.errors.catalog import entries
from torchdoctor.report.diagnoses import render_full
from torchdoctor.report.explanation import code_lines


def test_a_block_header_keeps_its_body() -> None:
    code = (
        "with torch.no_grad():\n"
        "    n_features = self.features(torch.zeros(1, 3, 224, 224)).flatten(1).shape[1]"
    )
    assert one_line(code) == (
        "with torch.no_grad(): "
        "n_features = self.features(torch.zeros(1, 3, 224, 224)).flatten(1).shape[1]"
    )


def test_statements_comments_and_brackets() -> None:
    assert one_line("x = x + 1  # not x += 1\nx = torch.relu(x)") == "x = x + 1; x = torch.relu(x)"
    assert one_line("loader = DataLoader(ds,\n    num_workers=4)") == (
        "loader = DataLoader(ds, num_workers=4)"
    )
    assert one_line("s = '# not a comment'  # a comment") == "s = '# not a comment'"
    nested = "with torch.no_grad():\n    for p in params:\n        p -= lr * p.grad"
    assert one_line(nested) is None
    assert one_line("if a:\n    b()\nc()") is None


def test_every_one_line_form_of_the_catalog_compiles() -> None:
    """What one_line makes of the catalog's fixes is Python (placeholders aside)."""
    checked = 0
    for entry in entries():
        for fix in entry.fixes:
            for code in (fix.code,) if isinstance(fix.code, str) else fix.code:
                checked += _compiles_on_one_line(code)
    assert checked > 50


def _compiles_on_one_line(code: str) -> int:
    line = one_line(code)
    if line is None or "{" in code or "..." in code:
        return 0
    try:
        compile(code, "<fix>", "exec")
    except SyntaxError:
        return 0  # the catalog's own text is not Python (a shell line, a sketch)
    compile(line, "<one line>", "exec")
    return 1


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
        "Compute the flatten size from a dummy input: "
        "with torch.no_grad(): n = self.features(torch.zeros(1, 3)).shape[1]"
    )
    assert d.fix[1] == "Update by hand under no_grad" + CODE_ELSEWHERE
    record = {"kind": "crash", "severity": "error", "summary": d.summary, "fix": "\n".join(d.fix)}
    record.update(evidence=d.evidence, step=None, location=None)
    text = render_full([record])
    assert "  2. Update by hand under no_grad:\n       with torch.no_grad():\n" in text
    assert "           p -= lr * p.grad" in text


def test_a_fix_with_a_newline_stays_one_fix() -> None:
    d = Diagnosis("nan", "error", "s", fix=["first\n  second", "third"])
    assert d.fix == ["first second", "third"]
    assert d.row()[8].splitlines() == ["first second", "third"]  # the fix column


def test_brief_code_is_whole_or_says_what_is_left() -> None:
    codes = [c for e in entries() for f in e.fixes for c in _texts(f.code)]
    longest = max(codes, key=lambda c: c.count("\n"))
    assert code_lines(longest, "  ") == ["  " + line for line in longest.splitlines()]
    cut = code_lines("\n".join(f"x{i} = {i}" for i in range(20)), "", limit=12)
    assert cut[-1] == "# ... 8 more lines: `torchdoctor explain`"


def _texts(text: str | tuple[str, ...]) -> tuple[str, ...]:
    return (text,) if isinstance(text, str) else text
