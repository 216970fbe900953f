"""The two ends of a long log: its start, where a job prints its environment, and its end,
where it meets its error. The middle of a long log is its progress lines. Light (no patterns
compiled), as every start of the CLI imports it with the explain command's module.
"""

from __future__ import annotations

EDGE = 256 * 1024


def of_text(text: str) -> str:
    """The first and last EDGE characters of a longer text, cut at whole lines."""
    if len(text) <= 2 * EDGE:
        return text
    head = text[:EDGE].rpartition("\n")[0]
    tail = text[-EDGE:].partition("\n")[2]
    return f"{head}\n{tail}"
