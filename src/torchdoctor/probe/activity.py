"""What a live process is doing, said as it is: still starting (importing torch, setting up),
stepping, or not stepping (and where its training thread is meanwhile). `eval` says it with
its answer and `list` shows it, so a slow start on a loaded machine is never reported as a
training that "has not started" or is stuck.
"""

from __future__ import annotations

import time

from torchdoctor.frames import is_user_file
from torchdoctor.probe.eval_scope import frame_label, thread_frame
from torchdoctor.telemetry.step_rows import StepHeadline

STARTING = "starting"
STEPPING = "stepping"
NOT_STEPPING = "not stepping"

_IMPORTLIB = "<frozen importlib._bootstrap>"


def doing(thread_id: int | None) -> str:
    """Where the thread is, in a few words: `importing torch._dynamo, from main() at
    train.py:81`, `in evaluate() at train.py:55`; empty when nothing can be said."""
    frame = thread_frame(thread_id)
    importing = None
    user = None
    while frame is not None:
        code = frame.f_code
        if code.co_filename == _IMPORTLIB and code.co_name == "_find_and_load":
            name = frame.f_locals.get("name")
            if isinstance(name, str):
                importing = name  # the outermost import wins: the one the script asked for,
                user = None  # from the frame that asked for it
        elif user is None and is_user_file(code.co_filename):
            user = frame_label(code.co_name, code.co_filename, frame.f_lineno)
        frame = frame.f_back
    if importing:
        return f"importing {importing}" + (f", from {user}" if user else "")
    return f"in {user}" if user else ""


QUIET_STEPS = 3  # no step for this many usual step times...
QUIET_MIN = 10.0  # ...and at least this many seconds is worth saying


def state(last: StepHeadline | None, now: float | None = None) -> str:
    """STARTING before the first step ends; STEPPING while steps keep ending; NOT_STEPPING once
    no step has ended for QUIET_STEPS usual step times and at least QUIET_MIN seconds (a slow
    step is not a stall)."""
    if last is None:
        return STARTING
    since = (time.time() if now is None else now) - last.time
    quiet = max(QUIET_MIN, QUIET_STEPS * (last.duration or 0.0))
    return STEPPING if since <= quiet else NOT_STEPPING
