"""The shell commands that README.md and docs/*.md tell people to run, as written, for the
docs-as-tests (tests/integration/test_docs_commands.py).

A fenced block is shell when it has no language or is `sh`, `bash`, `shell` or `console`;
`text` blocks are output and other languages (`python`, `ipython`) are code. In a block whose
lines start with `$ ` (a console transcript) only those lines are commands, the rest is what
they print. A command runs torchdoctor when its program is `torchdoctor` (in any stage of a
pipeline, after `VAR=value` assignments), when it sets `TORCHDOCTOR=1` (the way in through the
environment), or when it is `make demo`. A quoted argument may go on over several lines; a
`# comment` at the end of a line is the docs' and is left out.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SHELL = {"", "sh", "bash", "shell", "console"}
_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclasses.dataclass(frozen=True)
class DocCommand:
    file: str  # relative to the repository: README.md, docs/cli.md
    line: int  # where the command starts
    text: str  # as written, without its trailing comment; lines of a quoted argument kept

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


def blocks(path: Path) -> list[tuple[int, str, list[str]]]:
    """(first line number, language, lines) of each fenced block of `path`."""
    out = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, language = match.group(1), match.group(2)
        body = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        out.append((i + 2, language, body))
        i = j + 1
    return out


def strip_comment(text: str) -> str:
    """`text` without a trailing `# comment` outside quotes."""
    quote = None
    for i, char in enumerate(text):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip()
    return text.rstrip()


def _complete(text: str) -> bool:
    try:
        shlex.split(text)
    except ValueError:  # No closing quotation: the argument goes on on the next line
        return False
    return True


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # not shell (an apostrophe in an output line)
        return text.split()


def runs_torchdoctor(text: str) -> bool:
    for stage in re.split(r"\|(?!\|)", text):
        words = _words(stage)
        assignments = [w for w in words if _ASSIGNMENT.match(w)]
        rest = words[len(assignments) :] if words[: len(assignments)] == assignments else words
        if "TORCHDOCTOR=1" in assignments:
            return True
        if rest and rest[0] == "torchdoctor":
            return True
    return text.split() == ["make", "demo"]


def commands_of(path: Path) -> list[DocCommand]:
    name = str(path.relative_to(ROOT))
    out = []
    for first, language, body in blocks(path):
        if language not in SHELL:
            continue
        transcript = any(line.startswith("$ ") for line in body)
        i = 0
        while i < len(body):
            line, number = body[i], first + i
            i += 1
            if transcript:
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            text, j = strip_comment(line), i
            while not _complete(text) and j < len(body):
                text += "\n" + body[j]
                j += 1
            if _complete(text):
                i = j
            else:
                text = line  # never closed: not a quoted argument over several lines
            text = strip_comment(text)
            if text and runs_torchdoctor(text):
                out.append(DocCommand(name, number, text))
    return out


def doc_commands() -> list[DocCommand]:
    return [command for path in DOCS for command in commands_of(path)]
