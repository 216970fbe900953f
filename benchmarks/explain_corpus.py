"""`torchdoctor explain` measured on real error texts from public issue threads and forums.

The corpus (tests/fixtures/explain_corpus/*.txt) holds one text per file: what a program
printed (the error and its traceback, never the reporter's prose), under a small header:

    # source: https://github.com/owner/repo/issues/123
    # category: cudnn.error            (a catalog code, or `none`: outside the catalog)
    # fix: what fixed it, in our words (only where the thread states it)
    # fix_check: a regular expression (case-insensitive) that the first fix's title and
    #            code must match for the first fix to count as the one that worked
    # split: dev | heldout

The split is decided by the source address alone (`split_of`), once, when the text is added:
every text of one thread falls in the same part, and the held-out part is never used to tune
the catalog. The labels (category, fix, fix_check) were written when the text was collected.

    python benchmarks/explain_corpus.py              # the figures of both parts
    python benchmarks/explain_corpus.py --misses dev # the dev texts answered wrongly
    python benchmarks/explain_corpus.py add CATEGORY URL [--fix TEXT --check RE] < text
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "explain_corpus"
HEADER = re.compile(r"^# (?P<key>source|category|fix|fix_check|split): ?(?P<value>.*?)\s*$")
HELDOUT_SHARE = 3  # one source in three is held out


def split_of(source: str) -> str:
    """`heldout` for one source address in three (by its SHA-256), else `dev`."""
    digest = hashlib.sha256(source.strip().encode("utf-8")).hexdigest()
    return "heldout" if int(digest[:8], 16) % HELDOUT_SHARE == 0 else "dev"


@dataclass(frozen=True)
class Case:
    path: Path
    source: str
    category: str
    split: str
    text: str
    fix: str | None = None
    fix_check: str | None = None

    @property
    def name(self) -> str:
        return self.path.stem


def load(path: Path) -> Case:
    header: dict[str, str] = {}
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    i = 0
    while i < len(lines) and (m := HEADER.match(lines[i])):
        header[m["key"]] = m["value"]
        i += 1
    return Case(
        path=path,
        source=header["source"],
        category=header["category"],
        split=header["split"],
        text="".join(lines[i:]),
        fix=header.get("fix") or None,
        fix_check=header.get("fix_check") or None,
    )


def cases(corpus: Path = CORPUS) -> list[Case]:
    return [load(p) for p in sorted(corpus.glob("*.txt"))]


@dataclass(frozen=True)
class Verdict:
    case: Case
    category: str  # what explain said (`none` when not recognised)
    confident: bool  # explain named its category with confidence
    first_fix: str  # title and code of the first fix ("" when none)

    @property
    def category_right(self) -> bool:
        return self.category == self.case.category

    @property
    def confident_wrong(self) -> bool:
        return self.category != "none" and not self.category_right and self.confident

    @property
    def fix_right(self) -> bool | None:
        """None when the thread states no fix."""
        if self.case.fix_check is None:
            return None
        return bool(re.search(self.case.fix_check, self.first_fix, re.IGNORECASE))


def judge(case: Case) -> Verdict:
    from torchdoctor.errors.api import explain_text

    e = explain_text(case.text)
    first_fix = f"{e.fixes[0]['title']}\n{e.fixes[0]['code']}" if e.fixes else ""
    confident = e.confident
    return Verdict(case, e.category or "none", confident, first_fix)


@dataclass(frozen=True)
class Figures:
    texts: int
    category_right: int
    confident_wrong: int
    with_fix: int
    fix_right: int

    @property
    def category_rate(self) -> float:
        return self.category_right / self.texts if self.texts else 0.0

    @property
    def fix_rate(self) -> float:
        return self.fix_right / self.with_fix if self.with_fix else 0.0

    def line(self, name: str) -> str:
        return (
            f"{name:8s} texts {self.texts:4d}  category right {self.category_right:4d} "
            f"({self.category_rate:6.1%})  confident wrong {self.confident_wrong:3d}  "
            f"first fix right {self.fix_right:3d}/{self.with_fix:3d} ({self.fix_rate:6.1%})"
        )


def figures(verdicts: list[Verdict]) -> Figures:
    with_fix = [v for v in verdicts if v.fix_right is not None]
    return Figures(
        texts=len(verdicts),
        category_right=sum(v.category_right for v in verdicts),
        confident_wrong=sum(v.confident_wrong for v in verdicts),
        with_fix=len(with_fix),
        fix_right=sum(bool(v.fix_right) for v in with_fix),
    )


def measure(corpus: Path = CORPUS) -> dict[str, tuple[Figures, list[Verdict]]]:
    """Both parts' figures; `unseen`: the held-out texts that are not word for word a dev text
    (a bare one-line message many threads share can fall in both parts)."""
    verdicts = [judge(c) for c in cases(corpus)]
    out: dict[str, tuple[Figures, list[Verdict]]] = {}
    for split in ("dev", "heldout"):
        part = [v for v in verdicts if v.case.split == split]
        out[split] = (figures(part), part)
    dev_texts = {v.case.text.strip() for v in out["dev"][1]}
    unseen = [v for v in out["heldout"][1] if v.case.text.strip() not in dev_texts]
    out["unseen"] = (figures(unseen), unseen)
    return out


def _slug(source: str) -> str:
    m = re.search(r"github\.com/([^/]+)/([^/]+)/(?:issues|pull|discussions)/(\d+)", source)
    if m:
        return f"{m[1]}-{m[2]}-{m[3]}".lower()
    host = re.sub(r"^https?://(www\.)?", "", source)
    return re.sub(r"[^a-z0-9]+", "-", host.lower()).strip("-")[:60]


def add(category: str, source: str, text: str, fix: str | None, check: str | None) -> Path:
    """Write a new corpus file; its split is decided here, from the source, once."""
    if check is not None:
        re.compile(check)
    base = f"{category}--{_slug(source)}"
    path = CORPUS / f"{base}.txt"
    n = 2
    while path.exists():
        path = CORPUS / f"{base}-{n}.txt"
        n += 1
    header = [f"# source: {source}", f"# category: {category}"]
    if fix:
        header.append(f"# fix: {fix}")
    if check:
        header.append(f"# fix_check: {check}")
    header.append(f"# split: {split_of(source)}")
    CORPUS.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(header) + "\n" + text.strip("\n") + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb")
    p_add = sub.add_parser("add", help="add a text (read from stdin) to the corpus")
    p_add.add_argument("category")
    p_add.add_argument("source")
    p_add.add_argument("--fix")
    p_add.add_argument("--check")
    parser.add_argument("--misses", choices=("dev", "heldout"), help="list the wrong answers")
    args = parser.parse_args(argv)
    if args.verb == "add":
        print(add(args.category, args.source, sys.stdin.read(), args.fix, args.check))
        return 0
    results = measure()
    for split, (fig, _v) in results.items():
        print(fig.line(split))
    counts = Counter(c.category for c in cases())
    print(f"categories: {len(counts)}; texts: {sum(counts.values())}")
    if args.misses:
        for v in results[args.misses][1]:
            if not v.category_right or v.fix_right is False:
                fix = "" if v.fix_right is None else f" fix={'ok' if v.fix_right else 'WRONG'}"
                first = v.first_fix.splitlines()[0] if v.first_fix else ""
                print(
                    f"{v.case.name}: want {v.case.category} got {v.category}"
                    f"{' (confident)' if v.confident else ''}{fix} | {first}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
