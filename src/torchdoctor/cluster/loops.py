"""The for/while loops of a source file, as line ranges: whether a rank's stack is still in
the loop that issued its collectives or has left it (uneven batch counts) is a question about
the script's own structure. Read where the source can be read; cached per file and mtime."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable

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
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    ranges = [
        (node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While))
    ]
    _CACHE[path] = (st.st_mtime, sorted(ranges))
    return _CACHE[path][1]


def loops_of(files: Iterable[str]) -> dict[str, list[tuple[int, int]]]:
    out = {}
    for path in set(files):
        if not path or path.startswith("<"):
            continue
        ranges = loop_ranges(path)
        if ranges is not None:
            out[path] = ranges
    return out
