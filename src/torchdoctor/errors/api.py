"""explain_text(text) and explain_exception(exc): an error in, an Explanation out.

Never imports torch: exceptions are recognised by their class names and messages.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from torchdoctor.errors import extract, facts, here, torchrun
from torchdoctor.errors.catalog import Entry, Fields, entries, first, pick, rx

GENERIC_FIRST_STEPS: tuple[str, ...] = (
    "Read the last exception line of the last traceback: that is the error that stopped the "
    "run. A DataLoader worker's 'Original Traceback' or an earlier rank's traceback may hold "
    "the root cause.",
    "For CUDA errors, rerun with CUDA_LAUNCH_BLOCKING=1 so that the traceback points at the "
    "operation that failed; running one small batch on the CPU often gives a clearer message.",
    "In a multi-process run, read every rank's log: the first rank to fail has the root error, "
    "the others usually only time out waiting for it.",
    "Print the shape, dtype, device and requires_grad of the tensors on the failing line.",
    "Make it small: one batch, batch size 2, num_workers=0, no torch.compile, then overfit "
    "that single batch.",
)

ALSO_PLAIN_LINES = 500  # how far back plain lines are searched for other errors
MIN_RANK_LINES = 500  # plain lines searched per rank in a job's log, at least
# Exceptions that only report another one (the launcher's summary, its signal handler).
_WRAPPERS = ("ChildFailedError", "SignalException", "CalledProcessError")
CONFIRM_LINES = 30  # lines before a key-noun match searched for what confirms it

_RANK_IN_MESSAGE = (
    r"\[(?:PG \S+ )?Rank (\d+)\]",
    r"\bon rank (\d+)\b",
    r"\brank\s*:\s*(\d+)\b",
    r"\[rank(\d+)\]",
)


@dataclass
class Explanation:
    """What an error means and what to do about it. `category` is None when the error is not
    recognised; `causes` are ranked by what this text says; `fields` are the values pulled out
    of the message (sizes come as bytes in `<name>_bytes` and readable in `<name>`). `rank` is
    the rank the error came from when the text says (a rank prefix, the launcher's summary),
    `line` the line number (from 1) in the text of the line it was read from."""

    recognised: bool
    category: str | None
    title: str
    summary: str
    meaning: str
    fields: dict[str, Any] = field(default_factory=dict)
    causes: list[str] = field(default_factory=list)
    first_steps: list[str] = field(default_factory=list)
    fixes: list[dict[str, str]] = field(default_factory=list)
    matched: str | None = None
    exception: str | None = None
    family: str | None = None
    also: list[dict[str, Any]] = field(default_factory=list)
    rank: int | None = None
    line: int | None = None
    confidence: str = "high"
    facts: dict[str, Any] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def confident(self) -> bool:
        """A category named with confidence: a known wording of the family was read on the
        line that ended the text's story, not only its key nouns or an earlier line."""
        return self.recognised and self.confidence == "high"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines_skipped(self, after: int, count: int) -> None:
        """The line numbers as in the whole text, when it was explained without `count` of
        its lines that came after line `after` (a long log read from its two ends)."""
        if self.line is not None and self.line > after:
            self.line += count
        for other in self.also:
            if other.get("line_number") is not None and other["line_number"] > after:
                other["line_number"] += count


@dataclass(frozen=True)
class _Match:
    entry: Entry
    block: extract.TextBlock
    offset: int
    loose: bool = False  # matched only by the family's key nouns


def _match(block: extract.TextBlock, loose: bool = False) -> _Match | None:
    best: _Match | None = None
    message = block.text
    for entry in entries():
        m = entry.search_keys(message) if loose else entry.search(message)
        if m is not None and (best is None or entry.priority > best.entry.priority):
            best = _Match(entry, block, m.start(), loose)
    return best


def _match_line(
    lines: list[extract.Line], line: extract.Line, loose: bool = False
) -> _Match | None:
    """A plain log line is tried on its own (cheap); its block is built when it matches."""
    single = _match(extract.TextBlock((line,)), loose)
    if single is None:
        return None
    full = _match(extract.block_at(lines, line.index), loose)
    return full if full is not None and full.entry is single.entry else single


def _rank(block: extract.TextBlock, message: str) -> int | None:
    if block.rank is not None:
        return block.rank
    for pattern in _RANK_IN_MESSAGE:
        value = first(pattern, message)
        if value is not None:
            return int(value)
    return None


def _choose(
    lines: list[extract.Line], limit: int = extract.MAX_PLAIN_CANDIDATES
) -> tuple[_Match | None, list[_Match]]:
    """The error that matters, and the other recognised errors in the text.

    The last recognised exception wins, except that a consequence (an NCCL watchdog timeout,
    a peer that hung up) gives way to a root error found elsewhere in the text."""
    exception_blocks, plain_lines = extract.candidates(lines, limit)
    found: list[_Match] = []
    for block in exception_blocks:
        m = _match(block)
        if m is not None:
            found.append(m)
    primary = next((m for m in found if not m.entry.secondary), None)
    if primary is None:
        covered = {line.index for m in found for line in m.block.lines}
        for line in plain_lines:
            if line.index in covered:
                continue
            m = _match_line(lines, line)
            if m is None:
                continue
            found.append(m)
            if not m.entry.secondary:
                primary = m
                break
    if primary is None and found:
        primary = found[0]
    if primary is None:
        # No known wording: the families' key nouns, on exception lines, then the others.
        for block in exception_blocks:
            m = _match(block, loose=True)
            if m is not None:
                primary = m
                break
        if primary is None:
            for line in plain_lines[:ALSO_PLAIN_LINES]:
                m = _match_line(lines, line, loose=True)
                if m is not None:
                    primary = m
                    break
        if primary is not None:
            found.append(primary)
    if primary is not None:
        # Other errors told in plain log lines (an NCCL watchdog record, a kernel assert).
        covered = {line.index for m in found for line in m.block.lines}
        for line in plain_lines[: min(ALSO_PLAIN_LINES, limit)]:
            if line.index not in covered:
                m = _match_line(lines, line)
                if m is not None:
                    found.append(m)
    others: list[_Match] = []
    seen = {primary.entry.code} if primary else set()
    for m in found:
        if m.entry.code not in seen:
            seen.add(m.entry.code)
            others.append(m)
    return primary, others


def _order_fixes(entry: Entry, ranked_keys: list[str], fields: Fields) -> list[dict[str, str]]:
    position = {key: i for i, key in enumerate(ranked_keys)}
    scored: list[tuple[int, int, dict[str, str]]] = []
    for i, fix in enumerate(entry.fixes):
        title = pick(fix.title, fields)
        code = pick(fix.code, fields)
        if title is None or code is None:
            continue
        said = {"title": title, "code": code}
        check = fix.check_for(fields)
        if check:
            said["check"] = check
        ranks = [position[k] for k in fix.causes if k in position]
        scored.append((min(ranks) if ranks else len(position), i, said))
    scored.sort(key=lambda t: (t[0], t[1]))
    return [fix for _r, _i, fix in scored]


def _confidence(m: _Match, lines: list[extract.Line], found: list[_Match] | None = None) -> str:
    """ "low" when the category rests on key nouns alone, or on a line that an exception
    outside the catalog follows (the text's story may end elsewhere)."""
    if m.loose:
        start = m.block.start
        before = "\n".join(line.text for line in lines[max(0, start - CONFIRM_LINES) : start])
        if any(rx(p).search(before) for p in m.entry.confirm):
            return "high"
        return "low"
    covered = {line.index for x in (found or [m]) for line in x.block.lines}
    last = m.block.lines[-1].index
    for line in lines[last + 1 :]:
        if line.noise or line.index in covered:
            continue
        name = extract.exception_name(line.text)
        if name is None or name in _WRAPPERS:
            continue
        if _match(extract.TextBlock((line,))) is None:
            return "low"  # the text goes on to an error the catalog does not know
    return "high"


def _build(
    m: _Match,
    lines: list[extract.Line],
    text: str,
    known: Fields | None = None,
    machine: here.Machine | None = None,
    process: Sequence[here.Finding] = (),
) -> Explanation:
    """The explanation of match `m`; `known` are fields the text as a whole gave (the rank
    from a launcher's summary), which the message's own fields complete. `machine`: the facts
    of the machine where the error happened (torchdoctor.machine), which rule causes in or
    out; `process`: what the process that raised knew (telemetry/crash.py: whether grad was on
    in the step's forward, how many parameters train), which decides before the machine."""
    entry, block = m.entry, m.block
    message = block.text
    fields: Fields = {}
    rank = _rank(block, message)
    if rank is not None:
        fields["rank"] = rank
    fields.update(entry.fields_for(message, text))
    for name, value in (known or {}).items():
        fields.setdefault(name, value)
    if "location" not in fields:
        frame = extract.user_frame(extract.frames_before(lines, block.start))
        if frame is not None:
            fields["location"] = frame.describe()
            if frame.code:
                fields["code_line"] = frame.code
    stated = facts.read(text)
    local = here.context(machine) if machine is not None else {}
    # What decides the ranking: the message first, then what the text states, then the machine.
    context: Fields = {**local, **stated, **fields}
    found = list(process)
    if machine:
        found += here.findings(entry.code, entry.family, machine, context, text)
    for finding in found:
        for name, value in finding.fields.items():
            context.setdefault(name, value)
    ruled_in = {k for f in found for k in f.rule_in}
    ruled_out = {k for f in found for k in f.rule_out} - ruled_in
    ranked = entry.ranked_causes(text, context)
    ranked = [c for c in ranked if c.key in ruled_in] + [
        c for c in ranked if c.key not in ruled_in and c.key not in ruled_out
    ]
    causes: list[str] = []
    keys: list[str] = []
    for cause in ranked:
        rendered = cause.render(context, cause.key in ruled_in)
        if rendered is not None:
            causes.append(rendered)
            keys.append(cause.key)
    first_steps = [s for s in (pick(t, fields) for t in entry.first_steps) if s is not None]
    summary = next((s for s in (pick(t, fields) for t in entry.summary) if s), entry.title)
    return Explanation(
        recognised=True,
        category=entry.code,
        title=entry.title,
        summary=summary,
        meaning=entry.meaning,
        fields=fields,
        causes=causes,
        first_steps=first_steps,
        fixes=_order_fixes(entry, keys, context),
        matched=block.line_at(m.offset).text.strip(),
        exception=block.exception,
        family=entry.family,
        rank=fields.get("rank") if isinstance(fields.get("rank"), int) else None,
        line=block.line_at(m.offset).index + 1,
        confidence="high" if any(f.confirms for f in found) else _confidence(m, lines),
        facts=stated,
        evidence=[f.said for f in found],
        machine=local,
    )


def _last_exception_line(lines: list[extract.Line]) -> tuple[str | None, str | None]:
    for line in reversed(lines):
        if not line.noise:
            name = extract.exception_name(line.text)
            if name is not None:
                return line.text.strip(), name
    for line in reversed(lines):
        if not line.noise and line.text.strip():
            return line.text.strip(), None
    return None, None


def unknown(text: str, lines: list[extract.Line] | None = None) -> Explanation:
    """The honest answer for an error outside the catalog."""
    lines = extract.clean(text) if lines is None else lines
    matched, name = _last_exception_line(lines)
    if matched is None:
        summary = "The text holds no error message to explain."
    else:
        summary = f"torchdoctor does not recognise this error: {_shorten(matched)}"
    return Explanation(
        recognised=False,
        category=None,
        title="Error not recognised",
        summary=summary,
        meaning=(
            "This error is not in torchdoctor's catalog (`torchdoctor explain --list` shows "
            "what is). The generic first steps below still apply."
        ),
        first_steps=list(GENERIC_FIRST_STEPS),
        matched=matched,
        exception=name,
    )


def _shorten(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def explain_text(
    text: str, machine: here.Machine | None = None, process: Sequence[here.Finding] = ()
) -> Explanation:
    """Explain an error message, a traceback or a whole log (a torchrun log included: the
    answer is the root failure, the first rank's first error). `machine`: the facts of the
    machine where it happened (torchdoctor.evidence gathers them), evidence for the causes."""
    lines = extract.clean(text)
    job = torchrun.parse(lines)
    if job is not None:
        return _explain_job(lines, job, machine)
    primary, others = _choose(lines)
    if primary is None:
        return unknown(text, lines)
    cleaned = "\n".join(line.text for line in lines)
    out = _build(primary, lines, cleaned, machine=machine, process=process)
    out.also = [_also(m) for m in others]
    if any(_rival(m, primary) for m in others):
        out.confidence = "low"  # two root errors of different kinds: the pick may be wrong
    return out


def _rival(m: _Match, primary: _Match) -> bool:
    """Another error in the text that could be the root as well as the one picked: not a
    consequence (secondary), not a wrapper that reports another error (priority < 0)."""
    return (
        m.entry.code != primary.entry.code
        and not m.entry.secondary
        and not m.loose
        and m.entry.priority >= 0
        and primary.entry.priority >= 0
    )


def _also(m: _Match, rank: int | None = None) -> dict[str, Any]:
    line = m.block.line_at(m.offset)
    return {
        "category": m.entry.code,
        "title": m.entry.title,
        "line": _shorten(line.text.strip(), 200),
        "rank": rank if rank is not None else _rank(m.block, m.block.text),
        "line_number": line.index + 1,
    }


# --- logs of a job: one error per rank, the launcher's summary ---------------------------------


@dataclass
class _RankError:
    """What one rank's own lines say: its recognised error and the others, or the exception
    line of an error outside the catalog."""

    rank: int | None
    lines: list[extract.Line]  # the whole text with other ranks' lines blanked
    match: _Match | None
    others: list[_Match]
    exception: extract.Line | None  # an exception no catalog entry explains

    @property
    def root_like(self) -> bool:
        """A failure of its own, not a consequence of another rank's (a peer that hung up,
        a collective that timed out)."""
        return self.exception is not None or (
            self.match is not None and not self.match.entry.secondary
        )

    @property
    def index(self) -> int:
        if self.exception is not None and (self.match is None or self.match.entry.secondary):
            return self.exception.index
        assert self.match is not None
        return self.match.block.line_at(self.match.offset).index


def _rank_error(
    masker: torchrun.Masker, keep: set[int], rank: int | None, limit: int
) -> _RankError | None:
    view = masker.view(keep)
    primary, others = _choose(view, limit)
    covered = {line.index for m in [primary, *others] if m for line in m.block.lines}
    exception = None
    for index in sorted(keep, reverse=True):
        line = view[index]
        if index in covered or line.noise:
            continue
        if extract.exception_name(line.text) or torchrun.aborted_with(view, index):
            exception = line
            break
    if primary is None and exception is None:
        return None
    return _RankError(rank, view, primary, others, exception)


def _failure_fields(failure: torchrun.Failure) -> Fields:
    f: Fields = {}
    if failure.rank is not None:
        f["rank"] = failure.rank
    for name in ("exitcode", "signal", "host", "pid"):
        value = getattr(failure, name)
        if value is not None:
            f[name] = value
    return f


def _calls_by_rank(errors: list[_RankError]) -> str | None:
    """Where each rank stood when its collective gave up, when they stood at different calls:
    the ranks' code paths diverged (rank 0 in all_reduce, rank 1 in broadcast)."""
    calls: list[tuple[int, str]] = []
    for e in errors:
        if e.rank is None or e.match is None:
            continue
        frame = extract.user_frame(extract.frames_before(e.lines, e.match.block.start))
        if frame is not None:
            call = f"{frame.code} ({frame.file}:{frame.line})" if frame.code else frame.describe()
            calls.append((e.rank, call))
    if len(calls) < 2 or len({call for _r, call in calls}) < 2:
        return None
    return "; ".join(f"rank {r}: {call}" for r, call in sorted(calls))


def _explain_job(
    lines: list[extract.Line], job: torchrun.JobLog, machine: here.Machine | None = None
) -> Explanation:
    text = "\n".join(line.text for line in lines)
    groups: list[tuple[int | None, set[int]]] = [(r, set()) for r in job.ranks]
    by_rank = {r: keep for r, keep in groups}
    unranked: set[int] = set()
    for line in lines:
        if line.index in job.launcher or line.noise:
            continue
        keep = by_rank.get(line.rank) if line.rank is not None else unranked
        if keep is not None:
            keep.add(line.index)
    groups.append((None, unranked))
    # Plain lines are matched against the whole catalog: the budget of a single log is
    # shared among the ranks (each rank's last lines, where it failed, come first).
    limit = max(MIN_RANK_LINES, extract.MAX_PLAIN_CANDIDATES // len(groups))
    masker = torchrun.Masker(lines)
    errors = [e for r, keep in groups if keep and (e := _rank_error(masker, keep, r, limit))]
    errors.sort(key=lambda e: e.index)
    root_failure = job.root_failure
    fields: Fields = {}
    signalled = job.signalled_root
    if signalled is not None:
        # A rank killed by a signal (gloo's SIGABRT) wrote no Python traceback, hence no rank
        # prefix: the unprefixed error is that rank's, and the other ranks' lost connections
        # are its consequences, wherever they fall in the log.
        for e in errors:
            if e.rank is None:
                e.rank = signalled.rank
    own = [e for e in errors if e.root_like]
    root: _RankError | None = next(
        (e for e in own if signalled is not None and e.rank == signalled.rank),
        own[0] if own else None,
    )
    if root is not None and signalled is not None and root.rank == signalled.rank:
        fields.update(_failure_fields(signalled))
        frame = torchrun.fault_location(root.lines, root.index)
        if frame is not None:
            fields["location"] = frame.describe()
    if root is None and root_failure is not None:
        # Every rank's own error is a consequence (or there is none): the launcher's summary
        # may name the cause (a SIGKILL, a traceback recorded with @record).
        entry = _rank_error(masker, set(root_failure.lines), root_failure.rank, limit)
        if entry is not None and entry.match is not None and not entry.match.entry.secondary:
            root = entry
            fields.update(_failure_fields(root_failure))
    if root is None and errors:
        wanted = root_failure.rank if root_failure is not None else None
        root = next((e for e in errors if e.rank == wanted and e.rank is not None), errors[0])
        calls = _calls_by_rank(errors)
        if calls is not None:
            fields["calls_by_rank"] = calls
    if root is None and root_failure is not None:
        root = _rank_error(masker, set(root_failure.lines), root_failure.rank, limit)
        fields.update(_failure_fields(root_failure))
    if root is None:
        # Only the launcher's records: "failed (exitcode: -9) local_rank: 5 ...".
        root = _rank_error(masker, job.launcher, None, limit)
    if root is None:
        return unknown(text, lines)
    rank = root.rank
    if rank is None and len(job.failures) == 1:
        rank = job.failures[0].rank  # old torch: unprefixed output of the only failed rank
    if root.match is not None and (not root.match.entry.secondary or root.exception is None):
        if rank is not None:
            fields["rank"] = rank
        out = _build(root.match, root.lines, text, fields, machine)
        out.line = root.index + 1
    else:
        assert root.exception is not None
        out = unknown(text, lines)
        said = _shorten(root.exception.text.strip())
        out.summary = f"torchdoctor does not recognise this error: {said}"
        out.matched = root.exception.text.strip()
        out.exception = extract.exception_name(root.exception.text) or torchrun.aborted_with(
            root.lines, root.exception.index
        )
        out.line = root.exception.index + 1
    out.rank = rank
    also: list[dict[str, Any]] = []
    seen = {(out.category, rank)}
    for e in [root, *[x for x in errors if x is not root]]:
        for m in ([e.match] if e is not root and e.match else []) + e.others:
            key = (m.entry.code, e.rank)
            if key not in seen:
                seen.add(key)
                also.append(_also(m, e.rank))
    out.also = also
    return out


def _class_names(exc: BaseException) -> list[str]:
    return [cls.__name__ for cls in type(exc).__mro__]


def explain_exception(
    exc: BaseException,
    machine: here.Machine | None = None,
    process: Sequence[here.Finding] = (),
) -> Explanation:
    """Explain a caught exception: its traceback and message, and its class (torch's
    OutOfMemoryError, dynamo's Unsupported, ...) when the message alone says too little.
    `process`: facts of the process it was raised in (a live crash), evidence for causes."""
    text = exception_text(exc)
    out = explain_text(text, machine, process)
    if not out.recognised:
        names = _class_names(exc)
        for entry in entries():
            if any(name in entry.exceptions for name in names):
                lines = extract.clean(text)
                block = extract.TextBlock(
                    (extract.Line(0, f"{type(exc).__name__}: {exc}", str(exc)),),
                    type(exc).__name__,
                )
                cleaned = "\n".join(x.text for x in lines)
                out = _build(
                    _Match(entry, block, 0), lines, cleaned, machine=machine, process=process
                )
                break
    out.exception = type(exc).__name__
    return out


def exception_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def explain(error: BaseException | str, machine: here.Machine | None = None) -> Explanation:
    if isinstance(error, BaseException):
        return explain_exception(error, machine)
    if isinstance(error, str):
        return explain_text(error, machine)
    raise TypeError(f"explain() takes an exception or a string, not {type(error).__name__}")


__all__ = ["Explanation", "explain", "explain_exception", "explain_text"]
