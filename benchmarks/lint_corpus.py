"""`torchdoctor lint` over a corpus of real public training code: precision and speed.

The corpus (tests/fixtures/lint_real/corpus.json) names public repositories, the commit and
the files; this script reads them from local bare git mirrors (``--mirror``, default
/work/.mirror/<owner>+<name>/repo) and skips the repositories it cannot find. Notebooks are
exported to scripts the way nbconvert does (code cells in order, magics and shell escapes
commented out).
Every finding is looked up in the judged list (tests/fixtures/lint_real/judged.tsv:
true / debatable / false, with the reason), and precision is reported per rule:
true / (true + false). Nothing from the corpus is committed, only the judged list.

    python benchmarks/lint_corpus.py                 # precision and speed
    python benchmarks/lint_corpus.py --unjudged F    # write findings not judged yet to F
    python benchmarks/lint_corpus.py --src ../main/src   # another version of the linter
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "lint_real" / "corpus.json"
JUDGED = ROOT / "tests" / "fixtures" / "lint_real" / "judged.tsv"
MIRROR = Path(os.environ.get("TORCHDOCTOR_LINT_MIRROR", "/work/.mirror"))
FIELDS = ("repo", "commit", "path", "line", "code", "verdict", "reason", "excerpt")


@dataclass(frozen=True)
class Key:
    repo: str
    path: str
    line: int
    code: str


def notebook_to_script(raw: bytes) -> str:
    """The code cells of a notebook as one script, as `jupyter nbconvert --to script` lays
    them out; IPython magics and shell escapes become comments."""
    cells = json.loads(raw.decode("utf-8")).get("cells", [])
    out = []
    for cell in cells:
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        lines = ("".join(source) if isinstance(source, list) else source).splitlines()
        if lines and lines[0].startswith("%%"):  # a cell magic: the cell is not Python
            lines = [f"# {s}" for s in lines]
        lines = _comment_magics(lines)
        out.append("# In[ ]:\n\n\n" + "\n".join(lines) + "\n\n\n")
    return "#!/usr/bin/env python\n# coding: utf-8\n\n" + "".join(out)


def _comment_magics(lines: list[str]) -> list[str]:
    """`%magic` and `!shell` lines as comments, but not a `%` that continues an expression
    inside brackets (`print("..."\n      % (a, b))`)."""
    out, depth = [], 0
    for line in lines:
        if depth <= 0 and line.lstrip().startswith(("%", "!")):
            out.append(f"# {line}")
            continue
        out.append(line)
        code = line.split("#", 1)[0]
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
    return out


def repo_dir(mirror: Path, repo: str) -> Path:
    """The bare git directory of a mirrored repository (or the .git of a clone)."""
    root = mirror / repo.replace("/", "+") / "repo"
    return root / ".git" if (root / ".git").is_dir() else root


def materialize(mirror: Path, dest: Path) -> tuple[dict[str, Path], list[str]]:
    """Write the corpus files under dest/<owner>+<name>/; the repos found and those missing."""
    corpus = json.loads(CORPUS.read_text())
    found: dict[str, Path] = {}
    missing: list[str] = []
    for entry in corpus["repos"]:
        git = repo_dir(mirror, entry["repo"])
        if not git.exists():
            missing.append(entry["repo"])
            continue
        root = dest / entry["repo"].replace("/", "+")
        for path in entry["paths"]:
            raw = subprocess.run(
                ["git", "--git-dir", str(git), "show", f"{entry['commit']}:{path}"],
                capture_output=True,
                check=True,
            ).stdout
            target = root / path
            if path.endswith(".ipynb"):
                target = target.with_suffix(".ipynb.py")
                raw = notebook_to_script(raw).encode("utf-8")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(raw)
        found[entry["repo"]] = root
    return found, missing


def original_path(path: str) -> str:
    return path[: -len(".py")] if path.endswith(".ipynb.py") else path


def read_judged(path: Path = JUDGED) -> dict[Key, dict[str, str]]:
    if not path.exists():
        return {}
    with path.open(newline="", encoding="utf-8") as fh:
        rows = csv.DictReader(fh, delimiter="\t")
        return {Key(r["repo"], r["path"], int(r["line"]), r["code"]): r for r in rows}


def linter(src: Path | None) -> Any:
    """lint_paths(paths) of the torchdoctor in `src` (another checkout, to measure an
    older version: before the rules were passed in, lint_paths took only the paths)."""
    if src is not None:
        sys.path.insert(0, str(src))
    # Imported here: which torchdoctor is only known once the arguments are read.
    from torchdoctor.lint import engine, rules

    if "rules" in engine.lint_paths.__code__.co_varnames[: engine.lint_paths.__code__.co_argcount]:
        return lambda paths: engine.lint_paths(paths, rules.all_rules())
    return engine.lint_paths


def run_lint(roots: dict[str, Path], lint_paths: Any) -> tuple[list[tuple[Key, str]], int, float]:
    """(finding key, line text) for every finding, the file count, and the CPU seconds."""
    findings: list[tuple[Key, str]] = []
    files = 0
    start = time.process_time()
    results = {repo: lint_paths([str(root)]) for repo, root in roots.items()}
    seconds = time.process_time() - start
    for repo, result in results.items():
        files += result.files
        for f in result.findings:
            rel = Path(f.path).relative_to(roots[repo]).as_posix()
            lines = Path(f.path).read_bytes().decode("utf-8", "replace").splitlines()
            text = lines[f.line - 1].strip() if 0 < f.line <= len(lines) else ""
            findings.append((Key(repo, original_path(rel), f.line, f.code), text))
    return findings, files, seconds


def summarize(findings: list[tuple[Key, str]], judged: dict[Key, dict[str, str]]) -> str:
    per_rule: dict[str, Counter[str]] = {}
    for key, _text in findings:
        verdict = judged.get(key, {}).get("verdict", "unjudged")
        per_rule.setdefault(key.code, Counter())[verdict] += 1
    rows = ["| rule | findings | true | debatable | false | unjudged | precision |"]
    rows.append("|---|---|---|---|---|---|---|")
    total: Counter[str] = Counter()
    for code in sorted(per_rule):
        c = per_rule[code]
        total.update(c)
        rows.append(_row(code, c))
    rows.append(_row("all", total))
    return "\n".join(rows)


def _row(name: str, c: Counter[str]) -> str:
    decided = c["true"] + c["false"]
    precision = f"{100 * c['true'] / decided:.0f}%" if decided else "-"
    n = sum(c.values())
    return (
        f"| {name} | {n} | {c['true']} | {c['debatable']} | {c['false']} | {c['unjudged']} "
        f"| {precision} |"
    )


def lost(findings: list[tuple[Key, str]], judged: dict[Key, dict[str, str]]) -> list[Key]:
    """Judged-true findings that the linter no longer reports."""
    now = {k for k, _t in findings}
    return sorted(
        (k for k, r in judged.items() if r["verdict"] == "true" and k not in now),
        key=lambda k: (k.repo, k.path, k.line, k.code),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR)
    parser.add_argument("--unjudged", type=Path, help="write unjudged findings (TSV) here")
    parser.add_argument("--repeat", type=int, default=3, help="timing runs (best is kept)")
    parser.add_argument("--src", type=Path, help="lint with the torchdoctor package in this src/")
    args = parser.parse_args(argv)
    lint_paths = linter(args.src)
    with tempfile.TemporaryDirectory() as tmp:
        roots, missing = materialize(args.mirror, Path(tmp))
        if not roots:
            print(f"no corpus repositories under {args.mirror}; nothing to do")
            return 0
        best = float("inf")
        for _ in range(max(1, args.repeat)):
            findings, files, seconds = run_lint(roots, lint_paths)
            best = min(best, seconds)
    judged = read_judged()
    corpus = json.loads(CORPUS.read_text())["repos"]
    held_out = {e["repo"] for e in corpus if e.get("held_out")}
    print(f"{len(roots)} repositories, {files} files; missing: {', '.join(missing) or 'none'}")
    print(f"lint: {best:.2f} s CPU, {files / best:.0f} files/s (best of {args.repeat})")
    print(summarize(findings, judged))
    if held_out:
        count = len(held_out & set(roots))
        print(f"\nheld out ({count} repositories judged after the rules were set):")
        print(summarize([f for f in findings if f[0].repo in held_out], judged))
    gone = lost(findings, judged)
    for k in gone:
        print(f"LOST true finding: {k.repo} {k.path}:{k.line} {k.code}", file=sys.stderr)
    if args.unjudged:
        with args.unjudged.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh, delimiter="\t", lineterminator="\n")
            writer.writerow(FIELDS)
            commits = {e["repo"]: e["commit"] for e in corpus}
            for key, text in sorted(findings, key=lambda f: (f[0].repo, f[0].path, f[0].line)):
                if key not in judged:
                    row = [key.repo, commits[key.repo], key.path, key.line, key.code, "", "", text]
                    writer.writerow(row)
    return 1 if gone else 0


if __name__ == "__main__":
    sys.exit(main())
