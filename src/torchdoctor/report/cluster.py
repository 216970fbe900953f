"""A job's ranks side by side, read the same at 2 ranks and at 1000: main-thread stacks with
the ranks that share one grouped, job-level findings once (whoever reported them, however
often), and each rank's own findings grouped by what they say, ranks written as ranges
("ranks 0-6,8-15"), the rank named on every per-rank block."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from torchdoctor.diagnose.crash import CrashEvidence
from torchdoctor.diagnose.hang import HangEvidence
from torchdoctor.diagnose.record import Finding
from torchdoctor.frames import StackFrame, is_user_file, short_path, short_site
from torchdoctor.identity import ranks_text
from torchdoctor.report.diagnoses import as_told, render_full


def ranks_label(ranks: Sequence[int]) -> str:
    return ranks_text(ranks)


# -- stacks ----------------------------------------------------------------------------------
def main_stacks(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[StackFrame]:
    """The main thread's frames (innermost first) from python.backtrace rows."""
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    main = [r for r in records if r.get("is_main")]
    return [
        StackFrame(func=r["func"], file=r["file"], lineno=r["lineno"], code=r.get("code"))
        for r in sorted(main, key=lambda r: r["depth"])
    ]


def group_stacks(
    stacks: dict[int, list[StackFrame]],
) -> list[tuple[list[int], list[StackFrame]]]:
    """Ranks whose main-thread stacks are the same (function, file and line of every frame),
    largest group first."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    frames: dict[tuple[Any, ...], list[StackFrame]] = {}
    for rank, stack in sorted(stacks.items()):
        key = tuple((f.func, f.file, f.lineno) for f in stack)
        groups.setdefault(key, []).append(rank)
        frames.setdefault(key, stack)
    order = sorted(groups, key=lambda k: (-len(groups[k]), groups[k]))
    return [(groups[k], frames[k]) for k in order]


def render_backtrace(
    groups: list[tuple[list[int], list[StackFrame]]], unreachable: dict[int, str]
) -> str:
    """One block per group of ranks: the innermost frame (where it stands), the user's own
    frames with their code, and the library frames between them folded into one line."""
    blocks = []
    for ranks, stack in groups:
        lines = [f"{ranks_label(ranks)}: main thread"]
        for item in fold_frames(stack):
            if isinstance(item, str):
                lines.append(f"  ... {item}")
                continue
            lines.append(f"  {item.func} ({short_site(item.site)})")
            if item.code:
                lines.append(f"      {item.code}")
        if not stack:
            lines.append("  (no frames)")
        blocks.append("\n".join(lines))
    blocks += [f"{ranks_label(rs)}: unreachable: {reason}" for reason, rs in _by_text(unreachable)]
    return "\n\n".join(blocks) if blocks else "(no ranks)"


def fold_frames(stack: list[StackFrame]) -> list[StackFrame | str]:
    """The innermost frame and the user's frames; in words, each run of library frames
    between them."""
    out: list[StackFrame | str] = []
    run: list[StackFrame] = []
    for i, frame in enumerate(stack):
        if i == 0 or is_user_file(frame.file):
            if run:
                out.append(_folded(run))
                run = []
            out.append(frame)
        else:
            run.append(frame)
    if run:
        out.append(_folded(run))
    return out


def _folded(frames: list[StackFrame]) -> str:
    where = sorted({_library(f.file) for f in frames})
    return f"{len(frames)} frame{'s' if len(frames) > 1 else ''} of {', '.join(where)}"


def _library(path: str) -> str:
    path = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1].split("/", 1)[0]
    if path.startswith("<"):
        return path
    return "the standard library" if "/lib/python" in path else short_path(path)


# -- findings --------------------------------------------------------------------------------
def job_key(finding: Finding, job_kinds: Iterable[str]) -> str | None:
    """What makes two reports of a job-level finding the same one (its `job_key`; for records
    written before it existed, the kind and the rank it is about); None for a rank's own."""
    if finding.job_key:
        return finding.job_key
    if finding.kind in set(job_kinds):
        return f"{finding.kind}:{finding.rank}:{finding.location}"
    return None


def merge_findings(
    reported: Iterable[tuple[int | None, Finding]],
    fresh: Iterable[Finding],
    job_kinds: Iterable[str],
    fresh_first: bool = True,
) -> list[Finding]:
    """Every finding once: the job-level ones first, each reported by several ranks (or again
    later) merged into one (`found_by`: the ranks that reported it), then the ranks' own
    findings as they are. `reported`: (the rank that reported it, finding); `fresh`: the
    job-level findings computed now, in front of the reported ones (`fresh_first`: live, they
    are the job as it is now) or behind them (a job directory: the first report is the one the
    ranks printed)."""
    kinds = set(job_kinds)
    merged: dict[str, Finding] = {}
    job: list[Finding] = []
    own: list[Finding] = []

    def add(reporter: int | None, finding: Finding, key: str) -> None:
        seen = merged.get(key)
        if seen is None:
            seen = merged[key] = dataclasses.replace(finding, job=True, found_by=[])
            job.append(seen)
        found_by = seen.found_by if seen.found_by is not None else []
        if reporter is not None and reporter not in found_by:
            found_by.append(reporter)
        seen.found_by = found_by

    def add_fresh() -> None:
        for finding in fresh:
            add(None, finding, job_key(finding, kinds) or f"{finding.kind}:{finding.rank}")

    if fresh_first:
        add_fresh()
    for reporter, finding in reported:
        key = job_key(finding, kinds)
        if key is None:
            own.append(finding)
        else:
            add(reporter, finding, key)
    if not fresh_first:
        add_fresh()
    for finding in job:
        finding.found_by = sorted(finding.found_by or [])
    return job + own


def group_own(findings: list[Finding]) -> list[tuple[list[int], Finding]]:
    """The ranks' own findings grouped by what they say (kind, severity, step, place, and the
    category of a hang): (ranks, the lowest rank's finding), in the order first seen."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    first: dict[tuple[Any, ...], Finding] = {}
    for finding in findings:
        evidence = finding.evidence
        category = (
            evidence.category if isinstance(evidence, (HangEvidence, CrashEvidence)) else None
        )
        key = (finding.kind, finding.severity, finding.step, finding.location, category)
        rank = int(finding.rank or 0)
        groups.setdefault(key, [])
        if rank not in groups[key]:
            groups[key].append(rank)
        if key not in first or rank < int(first[key].rank or 0):
            first[key] = finding
    return [(sorted(groups[k]), first[k]) for k in groups]


def render_diagnoses(findings: list[Finding], unreachable: dict[int, str]) -> str:
    """Job-level findings once ("job:"), then each rank's own findings grouped by what they
    say ("ranks 0-6,8-15:", in the words of the lowest of them), then the ranks that could not
    be asked, grouped by the reason."""
    blocks = []
    for f in findings:
        if f.job:
            by = f.found_by or []
            who = f"job (found by {ranks_label(by)})" if by else "job"
            blocks.append(f"{who}: {render_full([f])}")
    for ranks, f in as_told(group_own([f for f in findings if not f.job]), lambda g: g[1]):
        blocks.append(f"{ranks_label(ranks)}: {render_full([f])}")
    if not blocks:
        blocks.append("no problems found")
    blocks += [f"{ranks_label(rs)}: unreachable: {reason}" for reason, rs in _by_text(unreachable)]
    return "\n\n".join(blocks)


def _by_text(texts: dict[int, str]) -> list[tuple[str, list[int]]]:
    groups: dict[str, list[int]] = {}
    for rank, text in sorted(texts.items()):
        groups.setdefault(text, []).append(rank)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1]))
