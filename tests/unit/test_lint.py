"""`torchdoctor lint`: every rule against its fixture (inline `# expect: CODE` on the lines it
must flag; every other line must stay clean), a corpus of well-written training scripts that
must give no finding at all, the engine (noqa, select/ignore, syntax errors), the CLI.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor.lint.engine import (
    SYNTAX_ERROR,
    SelectionError,
    lint_paths,
    lint_source,
    noqa_lines,
    select_rules,
)
from torchdoctor.lint.rule import Finding, Rule
from torchdoctor.lint.rules import FAMILIES, all_rules, by_code
from torchdoctor.report import lint as report

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "lint"
CLEAN = ROOT / "tests" / "fixtures" / "lint_clean"
DOCS = ROOT / "docs" / "lint.md"
EXPECT = re.compile(r"#.*\bexpect:\s*(?P<codes>TD\d{3}(?:\s*,\s*TD\d{3})*)")
FAMILY_OF = {"1": "memory", "2": "numerics", "3": "compile", "4": "loop", "5": "distributed",
             "6": "deprecated", "7": "checkpoint", "8": "config"}  # fmt: skip


def lint(source: str, path: str = "<string>") -> list[Finding]:
    return lint_source(source, all_rules(), path)


def expected(source: str) -> set[tuple[int, str]]:
    out = set()
    for number, line in enumerate(source.splitlines(), 1):
        m = EXPECT.search(line)
        if m:
            out |= {(number, c.strip()) for c in m["codes"].split(",")}
    return out


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.py")), ids=lambda p: p.stem)
def test_fixture(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    want = expected(source)
    assert want, f"{path.name} expects no finding"
    assert {code for _line, code in want} == {path.stem}, "a fixture is about its own rule"
    got = {(f.line, f.code) for f in lint(source, str(path))}
    assert got == want, f"missing {sorted(want - got)}, unexpected {sorted(got - want)}"
    # Each fixture also shows that a noqa comment with its code silences the rule.
    assert re.search(rf"#\s*noqa:\s*{path.stem}\b", source)


def test_every_rule_has_a_fixture() -> None:
    stems = {p.stem for p in FIXTURES.glob("*.py")}
    assert stems == {r.code for r in all_rules()}


@pytest.mark.parametrize("path", sorted(CLEAN.glob("*.py")), ids=lambda p: p.stem)
def test_clean_code_has_no_findings(path: Path) -> None:
    findings = lint(path.read_text(encoding="utf-8"), str(path))
    assert findings == [], "\n".join(f"{f.line}: {f.code} {f.message}" for f in findings)


def test_clean_corpus_is_substantial() -> None:
    files = list(CLEAN.glob("*.py"))
    assert len(files) >= 6
    assert sum(len(p.read_text().splitlines()) for p in files) > 800


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_rule_documentation(rule: object) -> None:
    assert isinstance(rule, Rule)
    assert re.fullmatch(r"TD\d{3}", rule.code)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name)
    assert rule.family == FAMILY_OF[rule.code[2]] and rule.family in FAMILIES
    assert rule.what and rule.why and rule.message and len(rule.message) <= 100
    # The documented example is flagged by the rule, and the documented fix is not.
    assert rule.code in {f.code for f in lint(rule.example)}, "example not flagged"
    assert rule.code not in {f.code for f in lint(rule.fix)}, "fix flagged"


def test_rule_names_and_codes_are_unique() -> None:
    rules = all_rules()
    assert len({r.code for r in rules}) == len({r.name for r in rules}) == len(rules) >= 15
    assert by_code("TD401") is not None and by_code("TD999") is None


SOURCE = """\
import torch

def train(model, loader, optimizer):
    for x, y in loader:
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
    state = torch.load("a.pt", weights_only=False)
"""


def test_findings_have_position_and_message() -> None:
    findings = lint(SOURCE, "t.py")
    assert [(f.line, f.col, f.code) for f in findings] == [(4, 5, "TD401"), (8, 13, "TD701")]
    assert all(isinstance(f, Finding) and f.message and f.path == "t.py" for f in findings)
    assert set(findings[0].to_dict()) >= {"path", "line", "col", "code", "message", "name"}


def test_noqa() -> None:
    assert noqa_lines("x = 1  # noqa: TD101, TD202\ny = 2  # NOQA\nz = 3  # noqa:E501\n") == {
        1: {"TD101", "TD202"},
        2: None,
        3: {"E501"},
    }
    bare = SOURCE.replace("weights_only=False)", "weights_only=False)  # noqa")
    assert [f.code for f in lint(bare)] == ["TD401"]
    other = SOURCE.replace("weights_only=False)", "weights_only=False)  # noqa: E501")
    assert [f.code for f in lint(other)] == ["TD401", "TD701"]


def test_select_and_ignore() -> None:
    rules = all_rules()
    assert [r.code for r in select_rules(rules, "TD40")] == [f"TD40{i}" for i in range(1, 7)]
    assert [r.code for r in select_rules(rules, ["TD401", "td701"])] == ["TD401", "TD701"]
    assert "TD401" not in {r.code for r in select_rules(rules, ignore="TD401")}
    assert [r.code for r in select_rules(rules, "TD4", "TD402,TD403,TD404,TD405,TD406")] == [
        "TD401"
    ]
    assert [r.code for r in select_rules(rules, "missing-zero-grad")] == ["TD401"]
    with pytest.raises(SelectionError):
        select_rules(rules, "TD9")


def test_syntax_error_is_a_finding(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("def f(:\n    pass\n")
    (tmp_path / "latin1.py").write_bytes(b"x = '\xe9'\n")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "skip.py").write_text("torch.load('a', weights_only=False)\n")
    (tmp_path / "notes.txt").write_text("not python")
    result = lint_paths([str(tmp_path)], select_rules(all_rules(), "TD7"))
    assert result.files == 2
    assert [(Path(f.path).name, f.code) for f in result.findings] == [
        ("bad.py", SYNTAX_ERROR),
        ("latin1.py", SYNTAX_ERROR),
    ]
    assert "cannot parse" in result.findings[0].message
    with pytest.raises(FileNotFoundError):
        lint_paths([str(tmp_path / "missing.py")], all_rules())


def test_report_rendering() -> None:
    findings = lint(SOURCE, "t.py")
    text = report.render(findings, 1)
    assert text.splitlines()[0].startswith("t.py:4:5: TD401 ")
    assert text.endswith("Found 2 problems (1 file checked).")
    assert report.render([], 3) == "No problems found (3 files checked)."
    assert [d["code"] for d in json.loads(report.render(findings, 1, "json"))] == [
        "TD401",
        "TD701",
    ]
    assert "Why it hurts" in report.rule_text(all_rules()[0])


def test_docs_list_every_rule() -> None:
    text = DOCS.read_text(encoding="utf-8")
    begin, end = "<!-- BEGIN RULES (generated) -->", "<!-- END RULES -->"
    generated = text.split(begin, 1)[1].split(end, 1)[0].strip()
    fresh = report.rules_markdown(all_rules()).strip()
    if generated != fresh:
        if "TORCHDOCTOR_UPDATE_DOCS" not in os.environ:
            pytest.fail("docs/lint.md is stale: rerun with TORCHDOCTOR_UPDATE_DOCS=1")
        head, tail = text.split(begin, 1)[0], text.split(end, 1)[1]
        text = f"{head}{begin}\n{fresh}\n{end}{tail}"
        DOCS.write_text(text, encoding="utf-8")
    for rule in all_rules():
        assert f"### {rule.code}" in text and rule.name in text


# --- the CLI, end to end ---------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("torchdoctor")
    cmd = [str(exe), *args] if exe.exists() else [sys.executable, "-m", "torchdoctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_cli_exit_codes_and_json(tmp_path: Path) -> None:
    fixture = str(FIXTURES / "TD401.py")
    out = _cli("lint", fixture, "--format", "json")
    assert out.returncode == 1, out.stderr
    data = json.loads(out.stdout)
    assert {(d["line"], d["code"]) for d in data} == expected(Path(fixture).read_text())
    assert all({"code", "line", "col", "message"} <= d.keys() for d in data)

    out = _cli("lint", str(CLEAN))
    assert out.returncode == 0 and out.stdout.startswith("No problems found"), out.stdout

    out = _cli("lint", str(tmp_path / "nope.py"))
    assert out.returncode == 2 and "no such file" in out.stderr

    out = _cli("lint", fixture, "--select", "TD9")
    assert out.returncode == 2 and "no rule matches" in out.stderr

    out = _cli("lint")
    assert out.returncode == 2


def test_cli_select_ignore_noqa(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SOURCE)
    out = _cli("lint", str(script), "--select", "TD7")
    assert out.returncode == 1 and " TD701 " in out.stdout and "TD401" not in out.stdout
    out = _cli("lint", str(script), "--ignore", "TD401,TD701")
    assert out.returncode == 0
    script.write_text(SOURCE.replace("for x, y in loader:", "for x, y in loader:  # noqa: TD401"))
    out = _cli("lint", str(script), "--format", "json")
    assert [d["code"] for d in json.loads(out.stdout)] == ["TD701"]
    (tmp_path / "broken.py").write_text("def f(:\n")
    out = _cli("lint", str(tmp_path / "broken.py"), "--ignore", "TD")
    assert out.returncode == 1 and "TD000" in out.stdout


def test_cli_rules_listing() -> None:
    out = _cli("lint", "--list-rules", "--format", "json")
    assert out.returncode == 0
    assert [r["code"] for r in json.loads(out.stdout)] == [r.code for r in all_rules()]
    out = _cli("lint", "--rule", "td402")
    assert out.returncode == 0 and "unscale_" in out.stdout


def test_lint_does_not_import_torch() -> None:
    code = (
        "import sys, io, contextlib\n"
        "from torchdoctor.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['lint', {str(CLEAN)!r}])\n"
        "assert 'torch' not in sys.modules, 'lint imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
