"""Where the step time that no phase claims goes, when it is much: stack samples of the
training thread, taken for a short window while no phase is open, find the loop's own input
function (nanoGPT's `get_batch` over memory-mapped shards, a generator that slices tensors):
input that does not come through a DataLoader, which no hook sees.

When: the doctor asks (`worth_sampling`: `other` took at least 30% of the recent steps and at
least 1 ms a step). A thread then reads the training thread's stack with
`sys._current_frames()` at about 200 Hz for 2 seconds (up to 6 while fewer than 3 steps have
ended), at most MAX_WINDOWS times a run and SPACING seconds apart: the training thread pays
nothing per step.

How a sample is read (`judge`, pure): samples taken inside a phase (a model call, backward(),
optimizer.step()) show the loop's frames, those outside torch's (and ours); in a sample taken
in a gap, the innermost of the loop's frames is where the loop is, and the frame it called is
the function the time goes to. A gap is named by the phase that closed before it (phases.py):
in nanoGPT's loop, `get_batch` runs in the gap after `forward` (the model returns, the next
batch is fetched, then backward() runs).

The input function: a function the loop calls that holds at least half of one gap's samples,
spread over the steps (in 3 steps at least, no step holding half of them: an evaluation every
N steps is not the loop's input, however long it takes), called from the user's code (a
trainer library's own loop is not judged), that is the user's own (or a library's generator,
`__next__` or `__getitem__`: an iterator the loop draws batches from), runs no module and is no
loss, logging, evaluation or checkpointing by its name. Its share of that gap is booked as
data_wait from then on (`PhaseTimer.input_shares`), and the `gap_samples` event names it with
its definition and the loop's line that calls it (dataloader_bound reports it). Every window
writes the event, with the top functions of each gap, whatever it found.
"""

from __future__ import annotations

import dataclasses
import linecache
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any

from torchdoctor._failsafe import warn_once
from torchdoctor.frames import is_library, is_torch, is_user_file, short_path

RATE = 200.0  # samples a second
WINDOW = 2.0  # seconds a window lasts
LONGEST = 6.0  # ... or longer, up to this, until it has seen MIN_STEPS steps
MIN_STEPS = 3  # steps a window must see to judge
MIN_SAMPLES = 10  # samples of a gap for its shares to mean anything
SHARE = 0.5  # the input function holds at least this share of its gap's samples
SPREAD = 0.5  # ... and no one step holds this share of them
MAX_WINDOWS = 3
SPACING = 120.0  # seconds between two windows
DEPTH = 64  # frames read per sample
# When the doctor asks: `other` over the recent steps, past the share and the seconds a step
# from which diagnose/unattributed_time.py says the time unexplained.
RECENT = 20
WARMUP = 3
# A function with a word of its name that starts with one of these is not the input (it is
# checked by name only: the samples cannot tell a slow metric from a slow batch).
NOT_INPUT: tuple[str, ...] = ("loss", "criterion", "log", "print", "save", "checkpoint", "ckpt")
NOT_INPUT += ("eval", "valid", "metric", "report", "plot", "test")
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
ITERATOR_NAMES = ("__next__", "__getitem__", "__getitems__", "__iter__")
_GENERATOR_FLAGS = 0x20 | 0x200  # CO_GENERATOR, CO_ASYNC_GENERATOR
_MODULE_CALLS = ("_call_impl", "_wrapped_call_impl")

Frames = tuple[tuple[Any, int], ...]  # (code object, line), innermost first


def worth_sampling(steps: Any) -> bool:
    """Whether the steps so far (a python.steps block) spend enough outside every phase for
    samples to be worth taking (the doctor asks, on its passes)."""
    from torchdoctor.diagnose.unattributed_time import MIN_OTHER, OTHER_SHARE

    if steps.rows < WARMUP + MIN_STEPS:
        return False
    other = steps.data["other"][-RECENT:]
    duration = steps.data["duration"][-RECENT:]
    total = float(duration.sum())
    return total > 0 and float(other.sum()) >= OTHER_SHARE * total and other.mean() >= MIN_OTHER


@dataclasses.dataclass(frozen=True)
class Sample:
    step: int  # the step in progress
    gap: str | None  # the gap it was taken in (None: inside a phase)
    frames: Frames


@dataclasses.dataclass
class Candidate:
    """What a gap's samples spent their time in: a function the loop called, or the loop's
    own line (a C call such as tensor indexing: `code` is None)."""

    site: tuple[str, int]  # the loop's line that called it
    code: Any = None  # the function's code object
    samples: int = 0
    steps: Counter[int] = dataclasses.field(default_factory=Counter)  # step -> samples
    runs_module: bool = False

    @property
    def regular(self) -> bool:
        """Seen step after step, not in one long call."""
        if len(self.steps) < MIN_STEPS:
            return False
        return max(self.steps.values()) < SPREAD * self.samples

    @property
    def name(self) -> str:
        return self.code.co_name if self.code is not None else "(the loop's own line)"

    def describe(self, gap_samples: int, gap_steps: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "function": self.code.co_name if self.code is not None else None,
            "site": f"{short_path(self.site[0])}:{self.site[1]}",
            "code": linecache.getline(self.site[0], self.site[1]).strip() or None,
            "share": self.samples / gap_samples,
            "steps": len(self.steps) / max(1, gap_steps),
        }
        if self.code is not None:
            out["file"] = short_path(self.code.co_filename)
            out["line"] = self.code.co_firstlineno
        return out


def judge(samples: list[Sample], sites: tuple[tuple[str, int] | None, ...] = ()) -> dict[str, Any]:
    """What a window's samples say: per gap, the functions its time went to (the top three)
    and, when there is one, the input function (`input`: its description and the share of
    each gap it runs in). `sites`: lines the loop is known to run (where it called the model,
    where it called backward()), for when no sample fell inside a phase."""
    loop = _loop_codes(samples) or _codes_at(samples, sites)
    by_gap: dict[str, dict[Any, Candidate]] = defaultdict(dict)
    gap_total: Counter[str] = Counter()
    gap_steps: dict[str, set[int]] = defaultdict(set)
    for s in samples:
        if s.gap is None:
            continue
        gap_total[s.gap] += 1
        gap_steps[s.gap].add(s.step)
        found = _candidate(s.frames, loop)
        if found is None:
            continue
        key, site, code, runs_module = found
        c = by_gap[s.gap].setdefault(key, Candidate(site, code))
        c.samples += 1
        c.steps[s.step] += 1
        c.runs_module = c.runs_module or runs_module
    gaps: dict[str, Any] = {}
    shares: dict[str, float] = {}
    chosen: Candidate | None = None
    for gap, total in gap_total.items():
        ranked = sorted(by_gap[gap].values(), key=lambda c: -c.samples)
        steps = len(gap_steps[gap])
        gaps[gap] = {"samples": total, "top": [c.describe(total, steps) for c in ranked[:3]]}
        if not ranked or total < MIN_SAMPLES:
            continue
        top = ranked[0]
        share = top.samples / total
        if share < SHARE or not top.regular or not _is_input(top):
            continue
        if chosen is not None and top.code is not chosen.code:
            if top.samples <= chosen.samples:
                continue
            shares.clear()  # another function dominates: name one, the one that takes most
        chosen = top if chosen is None or top.samples > chosen.samples else chosen
        shares[gap] = share
    out: dict[str, Any] = {
        "samples": len(samples),
        "steps": len({s.step for s in samples}),
        "loop_known": bool(loop),
        "gaps": gaps,
    }
    if chosen is not None:
        total = sum(gap_total[g] for g in shares)
        steps = len(set().union(*(gap_steps[g] for g in shares)))
        # its share of all the time outside phases (the gaps it runs in and those it does not):
        # what a row recorded before it was found holds of it in `other`
        of_other = sum(shares[g] * gap_total[g] for g in shares) / sum(gap_total.values())
        out["input"] = {**chosen.describe(total, steps), "gaps": shares, "of_other": of_other}
    return out


def _loop_codes(samples: list[Sample]) -> set[Any]:
    """The code objects of the loop's frames: in the samples taken inside a phase, the frames
    just outside the outermost frame of torch's (the model's call, backward(), the optimizer's
    step), up to the next frame of torch's or ours (our runner, when there is one)."""
    out: set[Any] = set()
    for s in samples:
        if s.gap is not None:
            continue
        outer = None
        for i, (code, _line) in enumerate(s.frames):
            if is_torch(code.co_filename):
                outer = i
        if outer is None:
            continue
        for code, _line in s.frames[outer + 1 :]:
            if is_library(code.co_filename):
                break
            out.add(code)
    return out


def _codes_at(samples: list[Sample], sites: tuple[tuple[str, int] | None, ...]) -> set[Any]:
    """The code objects of the samples' frames that hold one of `sites` (file, line): the
    loop's, when the phases are too short for a sample to land in one (a sampler thread gets
    the GIL where the training thread lets it go: in a slow Python fetch more than in a short
    forward)."""
    wanted = {site for site in sites if site is not None}
    out: set[Any] = set()
    seen: set[Any] = set()
    for s in samples:
        for code, _line in s.frames:
            if code in seen:
                continue
            seen.add(code)
            lines = {line for _start, _end, line in code.co_lines() if line is not None}
            if any(path == code.co_filename and line in lines for path, line in wanted):
                out.add(code)
    return out


def _candidate(frames: Frames, loop: set[Any]) -> tuple[Any, tuple[str, int], Any, bool] | None:
    """(key, the loop's line, the function it called or None, whether a module runs inside):
    what one gap sample shows, or None when the loop's frames are not in it."""
    at = None  # the innermost of the loop's frames, walking in from the outermost frame
    for i in range(len(frames) - 1, -1, -1):
        if frames[i][0] in loop:
            at = i
        elif at is not None:
            break
    if at is None:
        return None
    code, line = frames[at]
    site = (code.co_filename, line)
    if not is_user_file(code.co_filename):
        return ("library", code), site, None, False  # a trainer's loop: not judged
    runs_module = any(c.co_name in _MODULE_CALLS for c, _ in frames[:at])
    if at == 0:
        return ("line", code, line), site, None, runs_module
    callee = frames[at - 1][0]
    return ("call", callee, site), site, callee, runs_module


def _is_input(c: Candidate) -> bool:
    code = c.code
    if code is None or c.runs_module or not is_user_file(c.site[0]):
        return False
    words = [w.lower() for w in _WORDS.findall(code.co_name)]
    if any(w.startswith(NOT_INPUT) for w in words):
        return False
    if is_user_file(code.co_filename):
        return True
    if is_library(code.co_filename):
        return False  # torch's own: zero_grad, a loss, a tensor method
    return bool(code.co_flags & _GENERATOR_FLAGS) or code.co_name in ITERATOR_NAMES


class GapSampler:
    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.windows = 0
        self._next = 0.0  # time.monotonic() from which another window may start
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def request(self) -> bool:
        """Start a window of samples, unless one runs or the run has had its windows."""
        now = time.monotonic()
        if self._thread is not None and self._thread.is_alive():
            return False
        if self.windows >= MAX_WINDOWS or now < self._next or self._stop.is_set():
            return False
        self.windows += 1
        self._next = now + SPACING
        self._thread = threading.Thread(target=self._run, name="torchdoctor-gaps", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)

    def _run(self) -> None:
        try:
            samples = self.sample()
            # A run that ends while the window is open is judged on what it saw (the last pass
            # of diagnoses comes after this thread is joined): a short run is judged too.
            if len({s.step for s in samples}) < MIN_STEPS:
                return
            rec = self.rec
            verdict = judge(samples, (rec.roots.call_site, rec.state.backward_site))
            found = verdict.get("input")
            if found is not None:
                verdict["input"]["from_step"] = self.rec.step
                self.rec.timer.input_shares = dict(found["gaps"])  # rows from now on
            self.rec.event("gap_samples", verdict)
        except Exception as exc:  # a finding is a nicety: the training goes on
            warn_once("gap-samples", f"stack samples of the step failed: {exc}")

    def sample(self) -> list[Sample]:
        rec = self.rec
        timer = rec.timer
        thread = rec.train_thread
        first = rec.steps_done
        began = time.monotonic()
        samples: list[Sample] = []
        while not self._stop.wait(1.0 / RATE):
            spent = time.monotonic() - began
            if spent > LONGEST or (spent > WINDOW and rec.steps_done - first >= MIN_STEPS):
                break
            frame = sys._current_frames().get(thread)
            if frame is None:
                break  # the training thread is gone
            gap = timer.gap
            frames: list[tuple[Any, int]] = []
            while frame is not None and len(frames) < DEPTH:
                frames.append((frame.f_code, frame.f_lineno))
                frame = frame.f_back
            samples.append(Sample(rec.step, gap, tuple(frames)))
        return samples
