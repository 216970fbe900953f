"""The doctor thread: about once a second (less often on a long, fast run: see SHARE) it
snapshots the tables, runs every diagnosis module, and reports what is new. It also keeps
the hang watchdog: while no step comes it samples the main thread's stack, so a hang is told
from a long but busy phase.

Reporting a diagnosis = a python.diagnoses row, a line in diagnoses.jsonl (written at once,
so it survives a crash) and, unless quiet, an alert on stderr.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import threading
import time
from types import ModuleType
from typing import Any, Protocol

from torchdoctor._failsafe import warn_once
from torchdoctor.config import Config
from torchdoctor.diagnose import load_modules, story
from torchdoctor.diagnose.inputs import HangCapture, Inputs, JobInputs
from torchdoctor.diagnose.record import SEVERITIES, Diagnosis
from torchdoctor.store.tables import Tables
from torchdoctor.telemetry import gap_sampler, stacks
from torchdoctor.telemetry.group_timeout import hang_limit
from torchdoctor.views import TrainingView

TICK = 1.0
# The doctor's share of one core while the training steps, at most: passes that took `c`
# seconds of CPU (the least of the last three; the first three come a TICK apart, since a
# first pass's first calls and imports are no guide) wait `c / SHARE` before the next one.
# Its passes read whole tables, so they grow with the run; the thread holds the GIL while it
# works, so each of its seconds is one the training may lose. When no step has ended since
# the last pass (stuck, or a long step) it looks every TICK.
SHARE = 0.01
LONGEST_WAIT = 10.0
_NEEDS_MODULES = ("exploding_gradients", "vanishing_gradients")
STARTUP_GRACE = 300.0  # before the first step: imports, data set loading, compilation
RESOLVE_PASSES = 2  # passes in a row without a finding before it is marked resolved


class Host(Protocol):
    """What the doctor needs from the process it watches (the Session provides it)."""

    tables: Tables
    config: Config  # read live: hang_timeout may change on a running probe
    started: float  # when the probe started (Unix seconds)
    waiting: bool  # a notebook between cells waits for its user: no hang then
    resumed: float  # silence counts towards a hang from no earlier than this

    @property
    def telemetry(self) -> TrainingView | None:
        """The training in progress; None until torch is imported."""
        ...

    def save_diagnoses(self) -> None:
        """Write the new diagnoses to diagnoses.jsonl now (they must survive a crash)."""
        ...

    def alert(self, diagnosis: Diagnosis) -> None: ...

    def job(self) -> JobInputs | None:
        """The ranks of the job this process belongs to, side by side (None outside a job)."""
        ...


class Doctor:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.modules: list[ModuleType] = []  # _load(): on the doctor's thread
        self.reported: dict[str, Diagnosis] = {}
        self._resolves: dict[str, str] = {}  # identity -> the module whose finding it is, when
        # that module's findings resolve (RESOLVES: they describe the run as it stands)
        self._absent: dict[str, int] = {}  # identity -> passes in a row that did not find it
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._samples: list[tuple[int, float]] = []  # (main thread's stack signature, time)
        self._hang_since_step: int | None = None
        self._costs: list[float] = []  # CPU seconds of the latest passes
        self._hang_after: float | None = None  # the hang timeout the latest pass judged by
        self._steps_seen: int | None = None  # steps done at the latest pass
        self._thread = threading.Thread(target=self._loop, name="torchdoctor-doctor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            self.examine(final=True)
        except Exception as exc:
            warn_once("doctor-final", f"the last diagnosis pass failed: {exc}")

    def _loop(self) -> None:
        try:  # at once, on this thread: ready before a crash or a hang asks for them
            self._load()
        except Exception as exc:  # tried again at each pass
            warn_once("doctor", f"a diagnosis pass failed: {type(exc).__name__}: {exc}")
        wait = TICK
        while not self._stop.wait(wait):
            wait = self._next_wait(self._timed_pass())

    def _timed_pass(self) -> float:
        """A pass of the loop; the CPU seconds it took, without the first one's loading of the
        modules (a one-off that would space the next passes LONGEST_WAIT apart)."""
        began = time.thread_time()
        try:
            self._load()
            began = time.thread_time()
            self.examine()
        except Exception as exc:  # a bug in a diagnosis must not stop the others next time
            warn_once("doctor", f"a diagnosis pass failed: {type(exc).__name__}: {exc}")
        return time.thread_time() - began

    def _next_wait(self, cost: float) -> float:
        self._costs = [*self._costs[-2:], cost]
        training = self.host.telemetry
        done = training.steps_done if training is not None else None
        stepping, self._steps_seen = done != self._steps_seen, done
        if not stepping or len(self._costs) < 3:  # the first passes' costs are no guide
            return TICK
        wait = min(LONGEST_WAIT, max(TICK, min(self._costs) / SHARE))
        if self._hang_after is not None:
            # A stall is first looked at within a quarter of the hang timeout, so that a hang
            # is named about when it is due: a short timeout (a job's, half of its group's)
            # would otherwise pass while the doctor waits out its share.
            wait = min(wait, max(TICK, self._hang_after / 4))
        return wait

    def _load(self) -> None:
        """The diagnosis modules, loaded as the doctor's thread starts: not on the script's way
        to its first step (the probe starts as the script imports torch). A crash in the first
        moments, before the thread has them, loads them where it is reported."""
        if not self.modules:
            self.modules = load_modules()

    # -- one pass ----------------------------------------------------------------------------
    def examine(self, final: bool = False) -> list[Diagnosis]:
        """One pass: every module over the tables; what is new is reported, what stopped being
        true is marked resolved, and the findings are told as one story (story.py)."""
        self._load()
        inputs = self.inputs(final)
        found: list[Diagnosis] = []
        ran: set[str] = set()
        for module in self.modules:
            try:
                out = module.diagnose(inputs)
            except Exception as exc:
                warn_once(
                    f"diagnose:{module.__name__}",
                    f"{module.__name__} failed: {type(exc).__name__}: {exc}",
                )
                continue
            ran.add(module.__name__)
            if getattr(module, "RESOLVES", False):
                self._resolves.update((d.identity, module.__name__) for d in out)
            found.extend(out)
        self._ask_for_detail(found)
        if not final:
            self._ask_for_samples(inputs)
        new = [self._own(self._enrich(d)) for d in found if self.is_new(d)]
        return self._settle(new, {d.identity for d in found}, ran, inputs, final)

    def _settle(
        self,
        new: list[Diagnosis],
        holding: set[str],
        ran: set[str],
        inputs: Inputs,
        final: bool,
    ) -> list[Diagnosis]:
        """Report `new`; mark resolved the findings of modules that ran and no longer return
        them (`holding`: what this pass found); record every finding the story changed."""
        now = time.time()
        last = int(inputs.steps.data["step"][-1]) if inputs.steps.rows else None
        with self._lock:
            current = dict(self.reported)
        draft = dict(current)
        resolved: set[str] = set()
        for identity, d in current.items():
            if d.resolved is not None or self._resolves.get(identity) not in ran:
                continue
            if identity in holding:
                self._absent.pop(identity, None)
                continue
            # Gone from two passes in a row (or from the last): a share hovering at a
            # threshold does not flip a finding back and forth.
            self._absent[identity] = self._absent.get(identity, 0) + 1
            if self._absent[identity] >= RESOLVE_PASSES or final:
                draft[identity] = dataclasses.replace(d, resolved=last, time=now)
                resolved.add(identity)
                self._absent.pop(identity, None)
        # A module may return a finding twice (a warning, then an error at a later step):
        # each is reported, in order; the story is told over the last of each.
        draft.update((d.identity, d) for d in new)
        told = {d.identity: d for d in story.tell(list(draft.values()))}
        reported = []
        for d in new:
            story_of = told[d.identity]
            if d is not draft[d.identity]:
                story_of = dataclasses.replace(d, follows=story_of.follows)
            if self.report(story_of):
                reported.append(story_of)
        fresh = {d.identity for d in new}
        for identity, d in told.items():
            if identity not in fresh and _state(d) != _state(current[identity]):
                changed = d if identity in resolved else dataclasses.replace(d, time=now)
                self._record(changed, alert=identity in resolved)
        return reported

    def _ask_for_detail(self, found: list[Diagnosis]) -> None:
        """A gradient problem without a module yet: trace the next step to find it."""
        training = self.host.telemetry
        for d in found:
            if d.kind in _NEEDS_MODULES and d.location is None and training is not None:
                training.request_trace()

    def _ask_for_samples(self, inputs: Inputs) -> None:
        """Much of the step outside every phase: sample where it goes (an input function of the
        loop's own is then counted as data_wait, and dataloader_bound names it)."""
        training = self.host.telemetry
        if training is not None and gap_sampler.worth_sampling(inputs.steps):
            training.request_gap_samples()

    def is_new(self, diagnosis: Diagnosis) -> bool:
        with self._lock:
            old = self.reported.get(diagnosis.identity)
        if old is None or old.resolved is not None:
            return True  # never seen, or back after it was resolved
        located = old.location is None and diagnosis.location is not None
        return located or SEVERITIES.index(diagnosis.severity) > SEVERITIES.index(old.severity)

    def _enrich(self, diagnosis: Diagnosis) -> Diagnosis:
        """Live detail a stateless module cannot see: who holds leaking memory."""
        if diagnosis.kind != "memory_leak":
            return diagnosis
        from torchdoctor.diagnose.memory_leak import with_holders
        from torchdoctor.memory.holders import find_holders

        try:
            return with_holders(diagnosis, find_holders(self.host.telemetry))
        except Exception as exc:
            warn_once("leak-holders", f"could not name what holds the memory: {exc}")
            return diagnosis

    def inputs(self, final: bool = False) -> Inputs:
        tables = self.host.tables
        now = time.time()
        inputs = Inputs.of(
            lambda name: tables[name].snapshot(), self.host.config, now, cpus=os.cpu_count()
        )
        inputs.final = final
        if not final:
            inputs.hang = self._watch(inputs.steps, inputs.last_step_time, now)
            inputs.job = self.host.job()
        return inputs

    def _own(self, diagnosis: Diagnosis) -> Diagnosis:
        """The finding with this process's rank (a job-level finding keeps the rank it is
        about)."""
        if self.host.telemetry is not None and diagnosis.rank == 0 and not diagnosis.job:
            diagnosis.rank = self.host.telemetry.rank
        return diagnosis

    def report(self, diagnosis: Diagnosis) -> bool:
        """Record a diagnosis unless it was reported already (a rise in severity is new)."""
        self._own(diagnosis)
        if not self.is_new(diagnosis):
            return False
        self._record(diagnosis, alert=True)
        return True

    def _record(self, diagnosis: Diagnosis, alert: bool) -> None:
        """A row of python.diagnoses and a line of diagnoses.jsonl: the finding's state from
        now on (the latest row of a finding is what readers show)."""
        with self._lock:
            self.reported[diagnosis.identity] = diagnosis
        self.host.tables["diagnoses"].append(diagnosis.row())
        try:
            self.host.save_diagnoses()
        except Exception as exc:
            warn_once("diagnoses-file", f"cannot write diagnoses.jsonl: {exc}")
        if alert:
            self.host.alert(diagnosis)

    def found(self) -> list[Diagnosis]:
        with self._lock:
            return list(self.reported.values())

    # -- hang watchdog -----------------------------------------------------------------------
    def hang_timeout(self, steps: Any) -> float:
        """The configured timeout, else one derived from the step times; in a job, at most
        half of the process group's own timeout, so that a stuck rank is named before the
        group's collectives fail on their own."""
        configured = self.host.config.hang_timeout
        if configured:
            value = float(configured)
        elif not steps.rows:
            return STARTUP_GRACE
        else:
            recent = [float(d) for d in steps.data["duration"][-50:]]
            value = min(1800.0, max(60.0, 20.0 * statistics.median(recent)))
        limit = hang_limit()
        return min(value, limit) if limit else value

    def _watch(self, steps: Any, last: float | None, now: float) -> HangCapture | None:
        """The hang capture, when no step came for the timeout and the main thread stood still."""
        if self.host.waiting:
            return None  # a notebook between cells: waiting for its user is no hang
        started = max(self.host.started, self.host.resumed)
        idle = now - (max(last, started) if last is not None else started)
        step_count = int(steps.rows)
        if self._hang_since_step is not None and self._hang_since_step != step_count:
            self._hang_since_step = None  # steps came again: a later hang is a new one
        main = sys._current_frames().get(threading.main_thread().ident or 0)
        if main is None:
            return None
        # The same code at the same lines, frame after frame: a wait loop that re-enters the
        # same call (a queue polled with a timeout) counts as standing still too.
        signature = hash(tuple((f.f_code, f.f_lineno) for f in stacks.frames_of(main, 64)))
        sample = (signature, now)
        self._samples = [s for s in self._samples if now - s[1] <= idle] + [sample]
        timeout = self._hang_after = self.hang_timeout(steps)
        if idle < timeout or self._hang_since_step is not None:
            return None
        window = [s for s in self._samples if now - s[1] <= timeout]
        covered = bool(window) and now - window[0][1] >= 0.8 * timeout - TICK
        still = covered and all(s[0] == signature for s in window)
        if not still:
            return None
        self._hang_since_step = step_count
        return HangCapture(
            seconds=idle,
            timeout=timeout,
            steps=step_count,
            threads=stacks.capture_all(),
            pending=self._pending_collectives(),
        )

    def _pending_collectives(self) -> list[dict[str, Any]]:
        """This rank's collectives not seen completed (a rank outside a job has none)."""
        training = self.host.telemetry
        if training is None:
            return []
        training.settle_collectives()
        calls = self.host.tables["collectives"].snapshot()
        if not calls.rows:
            return []
        return [r for r in calls.to_records() if r["state"] == "issued"]


def _state(d: Diagnosis) -> tuple[object, ...]:
    """What a later row of the same finding may change."""
    return (d.severity, d.resolved, d.follows, tuple(d.fix), d.location)
