"""`torchdoctor lint` on real code: the judged corpus and its reproductions.

tests/fixtures/lint_real/judged.tsv holds every finding the rules (before and after the
precision work) gave on a corpus of public training code (corpus.json: repositories,
commits, files), each judged true / debatable / false by reading the line. The cases/
files reproduce the judged findings that matter as small scripts written for these tests
(`# expect: CODE` on the lines that must be flagged, every other line clean), so the
regression runs without the corpus. When the corpus mirrors are on this machine,
benchmarks/lint_corpus.py is run over it too.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from torchdoctor.lint.engine import lint_paths, lint_source
from torchdoctor.lint.rules import all_rules

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "lint_real"
EXPECT = re.compile(r"#.*\bexpect:\s*(?P<codes>TD\d{3}(?:\s*,\s*TD\d{3})*)")


def expected(source: str) -> set[tuple[int, str]]:
    out = set()
    for number, line in enumerate(source.splitlines(), 1):
        m = EXPECT.search(line)
        if m:
            out |= {(number, c.strip()) for c in m["codes"].split(",")}
    return out


@pytest.mark.parametrize("path", sorted((REAL / "cases").glob("*.py")), ids=lambda p: p.stem)
def test_reproduced_cases(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    got = {(f.line, f.code) for f in lint_source(source, all_rules(), str(path))}
    want = expected(source)
    assert got == want, f"missing {sorted(want - got)}, unexpected {sorted(got - want)}"


def judged() -> list[dict[str, str]]:
    with (REAL / "judged.tsv").open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def test_judged_list_is_complete_and_sourced() -> None:
    corpus = json.loads((REAL / "corpus.json").read_text())
    repos = {e["repo"]: e for e in corpus["repos"]}
    assert len(repos) >= 15
    assert sum(len(e["paths"]) for e in repos.values()) >= 200
    assert all(re.fullmatch(r"[0-9a-f]{40}", e["commit"]) for e in repos.values())
    rows = judged()
    keys = [(r["repo"], r["path"], r["line"], r["code"]) for r in rows]
    assert len(keys) == len(set(keys)), "a finding judged twice"
    codes = {r.code for r in all_rules()} | {"TD000"}
    for r in rows:
        assert r["repo"] in repos and r["path"] in repos[r["repo"]]["paths"], r
        assert r["commit"] == repos[r["repo"]]["commit"], r
        assert r["verdict"] in ("true", "debatable", "false") and r["reason"], r
        assert r["code"] in codes and int(r["line"]) > 0, r
    verdicts = Counter(r["verdict"] for r in rows)
    assert verdicts["true"] > 100 and verdicts["false"] >= 20


def test_every_judged_false_finding_of_a_rule_has_a_reproduction() -> None:
    # The cases cite their sources; a rule with false findings in the corpus must have
    # at least one of them reproduced.
    cited = "".join(p.read_text() for p in (REAL / "cases").glob("*.py"))
    cited += "".join(p.read_text() for p in (ROOT / "tests" / "fixtures" / "lint").glob("*.py"))
    false_rules = {r["code"] for r in judged() if r["verdict"] == "false"}
    for code in false_rules:
        sources = [r for r in judged() if r["code"] == code and r["verdict"] == "false"]
        assert any(Path(r["path"]).name in cited for r in sources), code


CORPUS_MIRROR = Path("/work/.mirror")


@pytest.mark.slow
@pytest.mark.skipif(not CORPUS_MIRROR.exists(), reason="the corpus mirrors are not here")
def test_corpus_precision(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import lint_corpus  # the benchmark's own code: materialise, compare with the list

    roots, missing = lint_corpus.materialize(CORPUS_MIRROR, tmp_path)
    if missing:
        pytest.skip(f"corpus incomplete: {missing}")
    findings, _files, _seconds = lint_corpus.run_lint(
        roots, lambda paths: lint_paths(paths, all_rules())
    )
    table = {k: r for k, r in lint_corpus.read_judged().items()}
    unjudged = [k for k, _t in findings if k not in table]
    assert not unjudged, f"findings nobody judged: {unjudged[:5]}"
    assert not lint_corpus.lost(findings, table), "true findings lost"
    verdicts = Counter(table[k]["verdict"] for k, _t in findings)
    assert verdicts["true"] / (verdicts["true"] + verdicts["false"]) >= 0.9
    back = [k for k, _t in findings if table[k]["verdict"] == "false"]
    assert not back, f"findings judged false are back: {back}"
