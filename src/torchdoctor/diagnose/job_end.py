"""How each rank of a job ended, and which ending was a rank's own failure rather than a
consequence of another rank's: shared by the job-level diagnoses (rank_died, missing_rank,
rank_raised).

A rank's ending is its own when it raised an error of its own (not a lost peer, not a timeout
waiting for one), crashed on a fatal signal, exited with an error code, or was killed without
a word (SIGKILL: the kernel's OOM killer, a scheduler, a user). It is a consequence when the
error says a peer went away ("Connection closed by peer") or a collective timed out waiting
for one, or when the launcher stopped it (SIGTERM, SIGHUP, SIGINT: torchrun stops every rank
once one has failed). Only real times order endings: the moment the error was raised, the
end the rank wrote, the moment faulthandler wrote a fatal signal's stacks; a rank killed with
SIGKILL leaves none, and is never placed by its last row (a stuck rank's last row is old).
"""

from __future__ import annotations

import dataclasses
import re
import signal as _signal
from typing import Any

from torchdoctor.diagnose.inputs import DEAD, JobInputs, RankView

# An error that says another rank went away: the rank lost a peer, it did not fail itself.
PEER_LOST = re.compile(
    r"closed by peer|reset by peer|broken pipe|connection refused|ECONNRESET|EPIPE|"
    r"remote process exited|communicator was aborted|peer .{0,40}(?:closed|exited|died)|"
    r"Socket Timeout|Connection (?:reset|closed)",
    re.IGNORECASE,
)
# An error that says a collective waited for its timeout: another rank never came.
TIMED_OUT = re.compile(r"timed out|timeout|Watchdog caught collective operation", re.IGNORECASE)
_STOPPED = ("terminated", "interrupted")  # a signal from outside: the launcher, a user
WHOLE = 2.0  # seconds: ranks stopped within this of each other were stopped together

RAISED, CRASHED, KILLED, EXITED = "raised", "crashed", "killed", "exited"
PEER_LOST_KIND, TIMED_OUT_KIND, STOPPED = "peer_lost", "timed_out", "stopped"
IN_COLLECTIVE = "in_collective"  # exited with an error while its collective was unfinished


@dataclasses.dataclass
class Ending:
    rank: int
    kind: str  # raised, crashed, killed, exited (its own); peer_lost, timed_out, in_collective,
    # stopped (consequences)
    how: str  # in words: "raised ValueError: bad batch", "killed by SIGKILL"
    time: float | None  # when it happened, where a real time is known
    line: str | None = None  # file:line where it raised
    step: int | None = None
    alive: bool = False  # raised, yet its process still runs
    signal: str | None = None
    after: str | None = None  # what came after it: "then stayed alive until terminated by ..."

    @property
    def own(self) -> bool:
        return self.kind in (RAISED, CRASHED, KILLED, EXITED)

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def endings(job: JobInputs) -> dict[int, Ending]:
    """rank -> its ending, for the ranks that ended or raised (worked out once per view). When
    every rank that ended was stopped from outside or killed at once without a time (the
    launcher, the scheduler or a user stopped the whole job), none of them is its own."""
    memo = job.memo.get("endings")
    if memo is not None:
        return dict(memo)
    out = {r: e for r, v in job.ranks.items() if (e := ending_of(v)) is not None}
    for rank, e in out.items():
        if e.kind == EXITED and _unfinished_call(job.ranks[rank]):
            # No error of its own on record, and its last collective never completed: it
            # exited because that collective failed (a peer went away, or a timeout).
            e.kind = IN_COLLECTIVE
    if stopped_whole(out):
        for e in out.values():
            if e.kind == KILLED:
                e.kind = STOPPED
    job.memo["endings"] = out
    return dict(out)


def ending_of(view: RankView) -> Ending | None:
    raised = view.raised
    if view.alive:
        if raised is None:
            return None
        error = _error(raised)
        return Ending(
            view.rank,
            _error_kind(error),
            f"raised {error}",
            _float(raised.get("time")),
            _line(raised),
            _int(raised.get("step")),
            alive=True,
        )
    if view.status not in DEAD:
        return None
    sig = view.signal or signal_of(view.exit_code)
    if raised is not None:
        error = _error(raised)
        kind = _error_kind(error)
        when = _float(raised.get("time")) or view.ended
        ending = Ending(view.rank, kind, f"raised {error}", when, line=_line(raised))
        ending.step = _int(raised.get("step"))
        if view.status in _STOPPED:
            ending.after = f"then stayed alive until {_signal_words(view.status, sig)}"
        return ending
    if view.status in _STOPPED:
        return Ending(view.rank, STOPPED, _signal_words(view.status, sig), view.ended, signal=sig)
    if view.status == "killed" or sig == "SIGKILL":
        return Ending(view.rank, KILLED, "killed by SIGKILL", view.ended, signal="SIGKILL")
    if view.status == "crashed" or sig:
        how = f"crashed on {sig or 'a fatal signal'}"
        return Ending(view.rank, CRASHED, how, view.ended, signal=sig)
    if view.reason and _error_kind(view.reason) != RAISED:
        return Ending(view.rank, _error_kind(view.reason), view.reason, view.ended)
    code = f" with exit code {view.exit_code}" if view.exit_code is not None else ""
    return Ending(view.rank, EXITED, f"exited{code}", view.ended)


def _unfinished_call(view: RankView) -> bool:
    """Whether its latest collective failed or never completed."""
    block = view.collectives
    if not block.rows:
        return False
    times, states = block.column("time"), block.column("state")
    latest = max(range(block.rows), key=lambda i: times[i])
    seq, group = block.column("seq")[latest], block.column("group")[latest]
    last = [
        s
        for s, q, g in zip(states, block.column("seq"), block.column("group"), strict=True)
        if q == seq and g == group
    ]
    return last[-1] != "completed"


def stopped_whole(ends: dict[int, Ending]) -> bool:
    """Whether the ranks that ended were stopped together from outside: no own error, no
    crash, and either every one stopped by a signal within WHOLE seconds of the others or
    two or more killed without a time (kill -9 of every rank, torchrun's SIGKILL)."""
    if len(ends) < 2 or any(e.kind in (RAISED, CRASHED, EXITED) for e in ends.values()):
        return False
    if any(e.kind in (PEER_LOST_KIND, TIMED_OUT_KIND, IN_COLLECTIVE) for e in ends.values()):
        return False
    killed = [e for e in ends.values() if e.kind == KILLED]
    if len(killed) == 1:
        return False  # one rank killed, the others stopped after it: it went first
    times = [e.time for e in ends.values() if e.kind == STOPPED and e.time is not None]
    return not times or max(times) - min(times) <= WHOLE or len(killed) >= 2


def first_own(ends: dict[int, Ending]) -> tuple[list[Ending], str]:
    """The rank(s) whose own failure came first, and how that is known:
    `time` (the earliest real time), `only` (the one own failure), `before_peers` (the one
    without a time, killed before the others lost it), `untimed` (several own endings and no
    time tells them apart)."""
    own = [e for e in ends.values() if e.own]
    if not own:
        return [], "none"
    if len(own) == 1:
        return own, "only"
    timed = sorted((e for e in own if e.time is not None), key=lambda e: (e.time or 0, e.rank))
    untimed = [e for e in own if e.time is None]
    if untimed:
        lost = [e.time for e in ends.values() if not e.own and e.time is not None]
        # One rank gone without a time while the others lost a peer before any timed own
        # failure: it is the peer they lost.
        went_before = not timed or (lost and min(lost) < (timed[0].time or 0))
        if len(untimed) == 1 and went_before:
            return untimed, "before_peers"
        if not timed:
            return sorted(untimed, key=lambda e: e.rank), "untimed"
    return [timed[0]], "time"


def signal_of(exit_code: int | None) -> str | None:
    """The signal an exit code stands for: torchrun's -9, a shell's 137 (128 + 9)."""
    if exit_code is None:
        return None
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else 0
    if number <= 0:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _signal_words(status: str, sig: str | None) -> str:
    verb = "interrupted" if status == "interrupted" else "terminated"
    return f"{verb} by {sig}" if sig else verb


_SOURCE = re.compile(r"^\[[^\]\s]*\.(?:cc|cpp|cu|h|hpp):\d+\]\s*")  # gloo's "[/path/pair.cc:456] "


def _error(raised: dict[str, Any]) -> str:
    kind = str(raised.get("exception") or "an exception")
    message = _SOURCE.sub("", str(raised.get("message") or "").strip()).splitlines()
    text = f"{kind}: {message[0]}" if message else kind
    return text if len(text) <= 200 else text[:197] + "..."


def _error_kind(error: str) -> str:
    if PEER_LOST.search(error):
        return PEER_LOST_KIND
    if TIMED_OUT.search(error):
        return TIMED_OUT_KIND
    return RAISED


def _line(raised: dict[str, Any]) -> str | None:
    file, line = raised.get("file"), raised.get("line")
    return f"{file}:{line}" if file and line is not None else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None
