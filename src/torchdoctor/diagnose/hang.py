"""`hang`: no step for the hang timeout while the main thread stands still. Where it is stuck
(data loading, a collective, a CUDA synchronisation, a lock or event, user code) and the
`file:line` of the blocking frame, from the watchdog's capture of every thread's stack. When
the main thread waits in one of this rank's pending collectives (DDP's gradient all-reduce
inside `loss.backward()`, `dist.all_reduce`), that collective and the line that issued it: the
rank waits for another one, which `cluster diagnoses` names."""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.parts import CollectiveCall
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import (
    StackFrame,
    ThreadStack,
    first_user,
    is_stdlib,
    short_site,
)

# (category, test on a frame, what it means, fixes)
_SYNC_CALLS = (".item()", ".cpu()", ".tolist()", ".numpy()", "synchronize(")


@kind("hang")
@dataclasses.dataclass(kw_only=True)
class HangEvidence(Evidence):
    category: str
    seconds: float
    timeout: float
    blocking_frame: StackFrame
    user_frame: StackFrame | None = None
    keeping_alive: list[ThreadStack] | None = optional()
    collective: CollectiveCall | None = optional()
    threads: list[ThreadStack]


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    capture = inputs.hang
    if capture is None:
        return []
    threads = capture.threads
    main = next((t for t in threads if t.is_main), None)
    if main is None or not main.frames:
        return []
    category, blocking, user = classify(main.frames)
    where = user or blocking
    location = short_site(where.site)
    seconds = float(capture.seconds)
    head = f"No training step for {seconds:.0f} s (timeout {capture.timeout:.0f} s): the main"
    head += " thread"
    call = waited_call(capture.pending, category, user)
    collective: CollectiveCall | None = None
    alive: list[ThreadStack] | None = None
    if call is not None:
        category = "collective"
        location = short_site(call.get("site")) or location
        waited = max(0.0, inputs.now - float(call["time"]))
        summary = (
            f"{head} waits in collective {_label(call)}, issued at {location or 'an unknown line'}"
            f" at step {call['step']}, for {waited:.0f} s: the other ranks have not all issued "
            "it. Look at them: `torchdoctor cluster diagnoses` names the rank that holds the "
            "job up, `torchdoctor cluster backtrace` shows where each rank is."
        )
        collective = CollectiveCall(
            group=call.get("group"),
            seq=call.get("seq"),
            op=call["op"],
            shapes=call.get("shapes"),
            dtype=call.get("dtype"),
            site=call.get("site"),
            step=call.get("step"),
            waited=waited,
        )
    elif category == "exiting":
        alive = keeping_alive(threads) or []
        names = thread_names(alive) if alive else "a non-daemon thread"
        summary = (
            f"{head} has ended the script's code and waits at exit for {names}: the process "
            "cannot exit while that thread runs."
        )
        first = first_user(f for t in alive for f in t.frames)
        location = short_site(first.site) if first else None
    else:
        summary = (
            f"{head} is stuck {_WHAT[category]} in {blocking.func}() ({short_site(blocking.site)})"
        )
        if user and user is not blocking:
            summary += f", called from {location}"
        summary += "."
    return [
        Diagnosis(
            kind="hang",
            severity="error",
            step=int(capture.steps),
            location=location,
            summary=summary,
            evidence=HangEvidence(
                category=category,
                seconds=seconds,
                timeout=capture.timeout,
                blocking_frame=blocking,
                user_frame=user,
                keeping_alive=alive,
                collective=collective,
                threads=_trim(threads),
            ),
            fix=_FIXES[category],
            key=f"hang:{capture.steps}",
        )
    ]


def waited_call(
    pending: list[dict[str, Any]], category: str, user: StackFrame | None
) -> dict[str, Any] | None:
    """The pending collective the main thread waits in: the oldest one issued at the user's
    line it stands at (DDP's gradient all-reduce is issued and awaited inside
    `loss.backward()`; `dist.all_reduce` at its own line), else, when the thread is inside
    torch.distributed, the oldest pending one. None when it waits for something else (a
    collective issued with async_op=True may be pending while the rank reads its data)."""
    if not pending:
        return None
    if user is not None:
        here = user.site
        mine = [c for c in pending if c.get("site") == here]
        if mine:
            return mine[0]
    return pending[0] if category == "collective" else None


def _label(call: dict[str, Any]) -> str:
    """`all_reduce #10`, `all_gather #3 of group tp [0,1]`, `recv #2 from rank 1`."""
    text = f"{call['op']} #{call['seq']}"
    group = str(call.get("group") or "default")
    if group != "default":
        text += f" of group {group}"
    peer = call.get("peer")
    if peer is not None:
        text += f" {'from' if call['op'].startswith(('recv', 'irecv')) else 'with'} rank {peer}"
    return text


def waits_at_exit(frames: list[StackFrame]) -> bool:
    """The main thread's code has ended (it returned, or raised) and the interpreter waits in
    threading's shutdown for the non-daemon threads to finish."""
    return (
        bool(frames)
        and frames[0].func == "_shutdown"
        and str(frames[0].file).replace("\\", "/").endswith("/threading.py")
    )


def keeping_alive(threads: list[ThreadStack]) -> list[ThreadStack] | None:
    """When the main thread waits at exit: the non-daemon threads it waits for, with their
    innermost frames (None when it does not wait so)."""
    main = next((t for t in threads if t.is_main), None)
    if main is None or not waits_at_exit(main.frames):
        return None
    return [
        dataclasses.replace(t, frames=t.frames[:4])
        for t in threads
        if not t.is_main and t.daemon is False
    ]


def thread_names(threads: list[ThreadStack]) -> str:
    """'thread uploader (train.py:12)', for the threads keeping_alive() returned."""
    parts = []
    for t in threads:
        frame = first_user(t.frames)
        at = f" ({short_site(frame.site)})" if frame else ""
        parts.append(f"{t.name!r}{at}")
    return ("thread " if len(parts) == 1 else "threads ") + ", ".join(parts)


def classify(frames: list[StackFrame]) -> tuple[str, StackFrame, StackFrame | None]:
    """(category, the frame it blocks in, the innermost frame of the user's own code)."""
    if waits_at_exit(frames):
        return "exiting", frames[0], None
    user = first_user(frames)
    files = [f.file.replace("\\", "/") for f in frames]
    funcs = [f.func for f in frames]
    blocking = frames[0]
    for frame, path in zip(frames, files, strict=True):
        if "/torch/utils/data/" in path:
            return "dataloader", frame, user
    for frame, path in zip(frames, files, strict=True):
        if "/torch/distributed/" in path:
            return "collective", frame, user
    for frame, path in zip(frames, files, strict=True):
        if "/torch/cuda/" in path and frame.func in ("synchronize", "wait", "query"):
            return "cuda_sync", frame, user
    syncing = user is not None and any(c in (user.code or "") for c in _SYNC_CALLS)
    if syncing and user is frames[0]:  # blocked in the C call a .item()/.cpu() line made
        return "cuda_sync", frames[0], user
    waits = ("wait", "acquire", "get", "join", "recv", "poll", "select", "sleep", "read")
    if is_stdlib(files[0]) and any(w in funcs[0] for w in waits):
        return "lock", blocking, user
    if any("/torch/_dynamo/" in p or "/torch/_inductor/" in p for p in files):
        return "compile", blocking, user
    return "user_code", user or blocking, user


def what(category: str) -> str:
    """Where a thread of this category is stuck, in words ("waiting for a DataLoader batch")."""
    return _WHAT[category]


def _trim(threads: list[ThreadStack], frames: int = 12) -> list[ThreadStack]:
    return [dataclasses.replace(t, frames=t.frames[:frames]) for t in threads[:20]]


_WHAT = {
    "dataloader": "waiting for a DataLoader batch",
    "collective": "inside a distributed collective",
    "cuda_sync": "waiting for the GPU (a synchronisation)",
    "lock": "waiting on a lock, event, queue or sleep",
    "compile": "compiling (torch.compile)",
    "user_code": "in your own code",
    "exiting": "at exit, waiting for non-daemon threads to finish",
}

_FIXES = {
    "exiting": [
        "the script's main code has ended but a non-daemon thread still runs, so the process "
        "cannot exit (and a launcher cannot see it fail): make the thread a daemon "
        "(threading.Thread(..., daemon=True)) or stop and join it in a `finally:`",
        "torchdoctor PID backtrace shows what that thread is doing",
    ],
    "dataloader": [
        "a worker is stuck or died: run with num_workers=0 once to see the error in-process",
        "set DataLoader(timeout=120) so a stuck worker raises instead of hanging",
        "look for locks, network file systems or CUDA use inside Dataset.__getitem__",
    ],
    "collective": [
        "another rank never reached this collective: `torchdoctor PID cluster diagnoses` names "
        "it (missing_rank) and `torchdoctor PID cluster backtrace` shows every rank's stack",
        "use DistributedSampler(drop_last=True) so every rank runs the same number of steps",
        "set a timeout so the hang becomes an error: "
        "init_process_group(timeout=timedelta(minutes=5))",
        "NCCL_DEBUG=INFO and TORCH_DISTRIBUTED_DEBUG=DETAIL tell which collective is pending",
    ],
    "cuda_sync": [
        "a kernel is still running or hung: CUDA_LAUNCH_BLOCKING=1 pins the error to its line",
        "a device-side assert or illegal access can surface here first: check the kernel log",
        "avoid per-step .item()/.cpu() calls in the hot loop; they wait for the whole queue",
    ],
    "lock": [
        "a thread waits for an event that never comes: check which thread should set it "
        "(torchdoctor PID backtrace shows every thread)",
        "add timeouts to queue.get()/event.wait() so a lost producer becomes an error",
    ],
    "compile": [
        "torch.compile may just be slow here: compare with mode='default' or compile fewer regions",
        "frequent recompilation: mark dynamic shapes or pad inputs to fixed sizes",
    ],
    "user_code": [
        "the main thread is stuck in your code at the line named: check its loop condition "
        "or the resource it waits for",
        "torchdoctor PID eval can inspect the variables of the stuck loop live",
    ],
}
