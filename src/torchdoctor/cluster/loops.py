"""The for/while loops of a source file, as line ranges: whether a rank's stack is still in
the loop that issued its collectives or has left it (uneven batch counts) is a question about
the script's own structure. Read where the source can be read; cached per file and mtime.

Read with the tokenizer, not `ast`: this runs on the doctor's thread, and in CPython 3.11 two
threads building ASTs at once (the training thread's traceback formatting does, for its carets:
Dynamo's graph-break messages) can fail either of them with "SystemError: AST constructor
recursion depth mismatch". The ranges are those of `ast.For`/`ast.While` (an `else:` clause
included), checked on the sources of torch and of this project in tests/unit/test_loops.py.
"""

from __future__ import annotations

import io
import os
import tokenize
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchdoctor.diagnose.inputs import RankView

_CACHE: dict[str, tuple[float, list[tuple[int, int]]]] = {}
MAX_BYTES = 2_000_000


def loop_ranges(path: str) -> list[tuple[int, int]] | None:
    """(first, last) line of every loop statement in `path`; None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    cached = _CACHE.get(path)
    if cached is not None and cached[0] == st.st_mtime:
        return cached[1]
    if st.st_size > MAX_BYTES:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            ranges = loops_in(f.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, tokenize.TokenError):
        return None
    _CACHE[path] = (st.st_mtime, ranges)
    return ranges


def loops_in(source: str) -> list[tuple[int, int]]:
    """(first, last) line of every for/while statement of `source`, sorted."""
    out: dict[int, int] = {}  # first line -> last line
    open_loops: list[tuple[int, int]] = []  # (first line, indentation depth) of loops open
    header: tuple[int, int] | None = None  # a loop statement whose header is being read
    body: tuple[int, int] | None = None  # a loop whose header ended: a block or one line?
    closed: tuple[int, int] | None = None  # the loop a dedent closed last (an `else:` reopens)
    depth, last, at_start = 0, 0, True
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        kind = tok.type
        if body is not None and kind not in (tokenize.NL, tokenize.COMMENT):
            if kind == tokenize.INDENT:
                open_loops.append(body)  # its block: closed by the dedent after it
            else:
                out[body[0]] = last  # `for x in y: f(x)`: the loop is its one line
            body = None
        if kind == tokenize.INDENT:
            depth += 1
        elif kind == tokenize.DEDENT:
            depth -= 1
            while open_loops and open_loops[-1][1] >= depth:
                closed = open_loops.pop()
                out[closed[0]] = last
        elif kind == tokenize.NEWLINE:
            last, at_start = tok.start[0], True
            body, header = header, None
        elif kind not in (tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
            last = tok.end[0]
            if not at_start:
                continue
            word = tok.string if kind == tokenize.NAME else ""
            if word == "async":
                continue  # `async for`: the statement's word is the next one
            at_start = False
            if word == "else" and closed is not None and closed[1] == depth:
                open_loops.append(closed)  # for/while ... else: the else is the loop's
            elif word in ("for", "while"):
                header = (tok.start[0], depth)
            closed = None
    for first, _depth in open_loops:
        out[first] = last
    return sorted(out.items())


def loops_of(files: Iterable[str]) -> dict[str, list[tuple[int, int]]]:
    out = {}
    for path in set(files):
        if not path or path.startswith("<"):
            continue
        ranges = loop_ranges(path)
        if ranges is not None:
            out[path] = ranges
    return out


def loops_of_ranks(views: Iterable[RankView]) -> dict[str, list[tuple[int, int]]]:
    """The loops of every source file the ranks' main-thread stacks and collectives' sites
    name (a job's `JobInputs.loops`)."""
    files: list[str] = []
    for view in views:
        files += [f.file for f in view.stack or []]
        if view.collectives.rows:
            files += [s.rpartition(":")[0] for s in set(view.collectives.column("site")) if s]
    return loops_of(files)
