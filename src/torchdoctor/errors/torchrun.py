"""Whole logs of a job started by torchrun (or torch.distributed.launch / elastic agents).

Such a log interleaves three things: the ranks' own output, prefixed ``[rank3]:`` since
torch 2.2 (``[default3]:`` with ``--tee``, nothing in older versions); the launcher's log
records (``W1123 ... torch/distributed/elastic/multiprocessing/api.py:...] Sending process
... closing signal SIGTERM``); and, when a worker failed, the launcher's own traceback ending
in ``ChildFailedError`` followed by its summary (``Failures:`` and ``Root Cause (first observed
failure):``, one entry per failed rank with its exit code, the signal that ended it and, when
the script used ``@record``, its traceback).

`parse` finds the launcher's lines, which are never a rank's error, and the summary's entries.
The error that matters is chosen by `torchdoctor.errors.api` from the ranks' own lines first.

A rank killed by a signal writes no Python traceback and so no rank prefix: a C++ exception
that nothing caught (gloo's ``terminate called after throwing an instance of
'gloo::EnforceNotMet'`` and its ``what():`` line, then SIGABRT) and, under ``@record``,
faulthandler's dump of the Python stack. Such unprefixed lines belong to the rank the summary
names as the root cause when a signal ended it (`signalled_root`).
Pure text, no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from torchdoctor.errors.extract import _ANSI, Frame, Line, exception_name

# A log record of the launcher itself: glog style (torch >= 2.1), Python logging style
# (older), or the bracketed style some versions used for torch.distributed.run warnings.
_LAUNCHER_RECORD = re.compile(
    r"^(?:\[[^\]]*\]\s*)?(?:"
    r"[IWEF]\d{4}\s+[\d:.]+\s+\d+\s+\S*torch/distributed/(?:elastic|run\.py|launch)"
    r"|(?:INFO|WARNING|ERROR|CRITICAL):torch\.distributed\.(?:elastic|run|launch)"
    r"|torch\.distributed\.(?:elastic\S*|run|launch): \[(?:INFO|WARNING|ERROR)\]"
    r")"
)
_CHILD_FAILED = "ChildFailedError"
_RULE = re.compile(r"^\s*(?:=|-|\*){10,}\s*$")
_ENTRY = re.compile(r"^\s*\[(\d+)\]:\s*$")
_ROOT = re.compile(r"^\s*Root Cause(?: \(first observed failure\))?\s*:\s*$")
_FAILURES = re.compile(r"^\s*(?:Failures|Other Failures)\s*:\s*$")
_KEY = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback|msg)\s*:\s?(.*)$")
_RANK_VALUE = re.compile(r"(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT_VALUE = re.compile(r"(-?\d+)(?:\s*\(pid:\s*(\d+)\))?(?:\s*\((SIG\w+)\))?")
_NO_TRACEBACK = re.compile(r"To enable traceback see|^<N/A>$|^$")
_TERMINATE = re.compile(r"^terminate called after throwing an instance of '([^']+)'")
_WHAT = re.compile(r"^\s*what\(\):\s+\S")
_FATAL = re.compile(r"^Fatal Python error: ")
# faulthandler's frames (most recent first): no comma before "in", unlike a traceback's.
_FAULT_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
MAX_FAULT_LINES = 200
MAX_SUMMARY_LINES = 5000

# Signal numbers as torchrun reports them (exit code -N); the name is what users search for.
SIGNALS = {
    1: "SIGHUP",
    2: "SIGINT",
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    9: "SIGKILL",
    11: "SIGSEGV",
    15: "SIGTERM",
}


@dataclass(frozen=True)
class Failure:
    """One entry of the launcher's summary: a worker that failed."""

    rank: int | None
    local_rank: int | None
    exitcode: int | None
    pid: int | None
    host: str | None
    time: str | None
    root: bool  # under "Root Cause (first observed failure)"
    lines: tuple[int, ...]  # every line of the entry
    traceback: tuple[int, ...] = ()  # the lines of its "traceback :" value, when it has one

    @property
    def signal(self) -> str | None:
        if self.exitcode is None or self.exitcode >= 0:
            return None
        return SIGNALS.get(-self.exitcode, f"signal {-self.exitcode}")


@dataclass
class JobLog:
    """What a log says about the job beyond the ranks' own lines."""

    launcher: set[int] = field(default_factory=set)  # indices of the launcher's lines
    failures: list[Failure] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)  # ranks with own lines, by first appearance

    @property
    def root_failure(self) -> Failure | None:
        return next((f for f in self.failures if f.root), None)

    @property
    def signalled_root(self) -> Failure | None:
        """The root failure when a signal other than the launcher's own SIGTERM ended it (a
        SIGABRT of gloo or NCCL, a SIGSEGV, a SIGKILL) and the summary names its rank."""
        root = self.root_failure
        if root is None or root.rank is None or root.signal in (None, "SIGTERM"):
            return None
        return root


def _raw(line: Line) -> str:
    return _ANSI.sub("", line.raw).rstrip()


def _launcher_traceback(lines: list[Line], index: int) -> set[int]:
    """The launcher's traceback that ends at `index` (the ChildFailedError line)."""
    out = {index}
    i = index - 1
    while i >= 0 and index - i < 200:
        body = lines[i].text
        out.add(i)
        if body.startswith("Traceback (most recent call last)"):
            break
        if body and not body[:1].isspace() and not body.startswith("File "):
            out.discard(i)
            break
        i -= 1
    return out


def _summary_span(lines: list[Line], start: int) -> range:
    """From `start` to the rule that closes the summary (its second '=' rule)."""
    rules = 0
    end = min(len(lines), start + MAX_SUMMARY_LINES)
    for i in range(start, end):
        raw = _raw(lines[i]).strip()
        if raw.startswith("=") and _RULE.match(raw):
            rules += 1
            if rules == 2:
                return range(start, i + 1)
    return range(start, end)


@dataclass
class _Entry:
    """A summary entry while it is read."""

    root: bool
    lines: list[int]
    traceback: list[int] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)

    def failure(self) -> Failure:
        rank = _RANK_VALUE.search(self.values.get("rank", ""))
        exit_ = _EXIT_VALUE.match(self.values.get("exitcode", ""))
        plain_rank = self.values.get("rank", "")
        return Failure(
            rank=int(rank.group(1))
            if rank
            else (int(plain_rank) if plain_rank.isdigit() else None),
            local_rank=int(rank.group(2)) if rank else None,
            exitcode=int(exit_.group(1)) if exit_ else None,
            pid=int(exit_.group(2)) if exit_ and exit_.group(2) else None,
            host=self.values.get("host") or None,
            time=self.values.get("time") or None,
            root=self.root,
            lines=tuple(self.lines),
            traceback=tuple(self.traceback),
        )


def _entries(lines: list[Line], span: range) -> list[Failure]:
    """The entries of a summary: key lines (`rank : 1 (local_rank: 1)`, `exitcode : -9 ...`),
    then the `traceback :` value, which runs to the next entry or rule."""
    failures: list[Failure] = []
    root = False
    current: _Entry | None = None
    in_traceback = False
    for i in span:
        raw = _raw(lines[i])
        starts = _ENTRY.match(raw)
        if _ROOT.match(raw) or _FAILURES.match(raw) or _RULE.match(raw) or starts:
            if current is not None:
                failures.append(current.failure())
            root = root or bool(_ROOT.match(raw))
            current = _Entry(root, [i]) if starts else None
            in_traceback = False
            continue
        if current is None:
            continue
        current.lines.append(i)
        key = None if in_traceback else _KEY.match(raw)
        if key is None:
            if in_traceback:
                current.traceback.append(i)
            continue
        name, value = key.group(1), key.group(2).strip()
        current.values[name] = value
        if name in ("traceback", "msg"):
            in_traceback = True
            if not _NO_TRACEBACK.search(value):
                current.traceback.append(i)
    if current is not None:
        failures.append(current.failure())
    return failures


def parse(lines: list[Line]) -> JobLog | None:
    """The launcher's lines and summary, and the ranks that wrote lines of their own; None when
    the text is not the log of a job (no rank prefixes, no launcher output)."""
    job = JobLog()
    summary_starts: list[int] = []
    for line in lines:
        raw = _raw(line)
        if _LAUNCHER_RECORD.match(raw):
            job.launcher.add(line.index)
            continue
        text = line.text.strip()
        if exception_name(text) == _CHILD_FAILED:
            job.launcher |= _launcher_traceback(lines, line.index)
            summary_starts.append(line.index)
        elif _ROOT.match(raw) and not any(
            s <= line.index < s + MAX_SUMMARY_LINES for s in summary_starts
        ):
            # A pasted summary without the launcher's traceback: start at its first rule.
            start = line.index
            while (
                start > 0 and line.index - start < 200 and not _FAILURES.match(_raw(lines[start]))
            ):
                start -= 1
            summary_starts.append(start if _FAILURES.match(_raw(lines[start])) else line.index)
    for start in summary_starts:
        span = _summary_span(lines, start)
        job.launcher.update(span)
        job.failures.extend(_entries(lines, span))
    seen: set[int] = set()
    for line in lines:
        if line.rank is not None and line.index not in job.launcher and line.rank not in seen:
            seen.add(line.rank)
            job.ranks.append(line.rank)
    if not job.ranks and not job.launcher:
        return None
    return job


class Masker:
    """Views of `lines` with every line outside a selection blanked: same indices, so blocks
    and tracebacks of the kept lines read as before. The blank lines are made once."""

    def __init__(self, lines: list[Line]) -> None:
        self.lines = lines
        self._blank = [Line(line.index, "", line.raw, line.rank, True) for line in lines]

    def view(self, keep: set[int]) -> list[Line]:
        blank = self._blank
        return [line if line.index in keep else blank[line.index] for line in self.lines]


def aborted_with(lines: list[Line], index: int) -> str | None:
    """The C++ exception type when the line at `index` is the ``what():`` line of an exception
    nothing caught (the process then aborts with SIGABRT), else None."""
    if not _WHAT.match(lines[index].text) or index == 0:
        return None
    m = _TERMINATE.match(lines[index - 1].text.strip())
    return m.group(1) if m else None


def fault_location(lines: list[Line], start: int) -> Frame | None:
    """The innermost frame of the user's own code in the main thread of faulthandler's dump
    after `start` (the dump `@record` and faulthandler write when a signal kills the process).
    The main thread is the one whose stack reaches `<module>`; the abort itself often comes
    from a C++ thread Python does not know."""
    end = min(len(lines), start + MAX_FAULT_LINES)
    i = next((j for j in range(start, end) if _FATAL.match(lines[j].text)), None)
    if i is None:
        return None
    threads: list[list[Frame]] = []
    for line in lines[i + 1 : end]:
        m = _FAULT_FRAME.match(line.text)
        if m is not None and threads:
            threads[-1].append(Frame(m.group("file"), int(m.group("line")), m.group("func"), None))
        elif line.text.startswith(("Thread", "Current thread")):
            threads.append([])
        elif line.text.strip() and line.text[:1] != " ":
            break
    main = next((t for t in threads if any(f.func == "<module>" for f in t)), None)
    for frame in main or (threads[0] if threads else []):
        if not frame.library:
            return frame
    return None
