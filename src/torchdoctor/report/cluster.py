"""A job's ranks side by side: the rank list, main-thread stacks grouped by rank where they
are the same, and every rank's diagnoses with the job-level ones once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchdoctor.report.diagnoses import render_full


def ranks_label(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in sorted(ranks))


def main_stacks(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The main thread's frames (innermost first) from python.backtrace rows."""
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    main = [r for r in records if r.get("is_main")]
    return [
        {"func": r["func"], "file": r["file"], "lineno": r["lineno"], "code": r.get("code")}
        for r in sorted(main, key=lambda r: r["depth"])
    ]


def group_stacks(stacks: dict[int, list[dict[str, Any]]]) -> list[tuple[list[int], list[dict]]]:
    """Ranks whose main-thread stacks are the same (function, file and line of every frame),
    largest group first."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    frames: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for rank, stack in sorted(stacks.items()):
        key = tuple((f["func"], f["file"], f["lineno"]) for f in stack)
        groups.setdefault(key, []).append(rank)
        frames.setdefault(key, stack)
    order = sorted(groups, key=lambda k: (-len(groups[k]), groups[k]))
    return [(groups[k], frames[k]) for k in order]


def render_backtrace(
    groups: list[tuple[list[int], list[dict[str, Any]]]], unreachable: dict[int, str]
) -> str:
    blocks = []
    for ranks, stack in groups:
        lines = [f"{ranks_label(ranks)}: main thread"]
        for f in stack:
            lines.append(f"  {f['func']} ({f['file']}:{f['lineno']})")
            if f.get("code"):
                lines.append(f"      {f['code']}")
        if not stack:
            lines.append("  (no frames)")
        blocks.append("\n".join(lines))
    for rank, reason in sorted(unreachable.items()):
        blocks.append(f"rank {rank}: unreachable: {reason}")
    return "\n\n".join(blocks) if blocks else "(no ranks)"


def render_diagnoses(records: list[dict[str, Any]], unreachable: dict[int, str]) -> str:
    blocks = []
    for r in records:
        text = render_full([r])
        by = r.get("found_by")
        who = (
            f"job ({ranks_label(by)} found it)"
            if r.get("job") and by
            else "job"
            if r.get("job")
            else ranks_label([r["rank"]])
        )
        blocks.append(f"{who}: {text}")
    if not blocks:
        blocks.append("no problems found")
    for rank, reason in sorted(unreachable.items()):
        blocks.append(f"rank {rank}: unreachable: {reason}")
    return "\n\n".join(blocks)
