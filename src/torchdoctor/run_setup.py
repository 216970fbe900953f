"""How a run was started, as meta.json records it for `torchdoctor compare`: the environment
variables that change what torch does (CUDA_*, NCCL_*, TORCH_*, OMP_NUM_THREADS, ...), torch's
version and the CUDA it was built for, how busy the machine was (its load, and how long the
main thread waited for a CPU) at the start and at the end, and the script that `__main__` runs
(its path, the hash of its bytes, its arguments, and its text, which the session copies into
the run directory).

Nothing here imports torch. Values pass through redact.py: a variable whose name says it holds a
secret (a token, a password, a key) is recorded as `***`, and so is any NAME=value secret in a
value or in the script's text.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from torchdoctor import frames, machine, redact

# Variables that change what torch, its kernels or its collectives do.
PREFIXES = (
    "CUDA_",
    "NCCL_",
    "TORCH_",
    "PYTORCH_",
    "TORCHINDUCTOR_",
    "TORCHDYNAMO_",
    "CUBLAS_",
    "CUDNN_",
    "GLOO_",
    "KMP_",
    "MKL_",
)
NAMES = ("OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "LD_PRELOAD", "PYTHONHASHSEED")
MAX_VALUE = 500  # characters kept of one value
MAX_SOURCE = 1_000_000  # bytes of a script copied into the run directory; a larger one is hashed


def environment(
    env: Mapping[str, str] | None = None, secrets: Sequence[str | None] = ()
) -> dict[str, str]:
    """The variables that matter, by name, with secrets masked (and the `secrets` known by
    value, such as the endpoint's token)."""
    env = os.environ if env is None else env
    out = {}
    for name in sorted(env):
        if name.startswith(PREFIXES) or name in NAMES:
            value = redact.redact_text(f"{name}={env[name]}", secrets).partition("=")[2]
            out[name] = value[:MAX_VALUE]
    return out


@dataclasses.dataclass(frozen=True)
class Script:
    path: str
    sha256: str
    size: int
    text: str | None  # None when larger than MAX_SOURCE or not text
    argv: list[str]  # its sys.argv, redacted

    def facts(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "bytes": self.size, "argv": self.argv}


def main_script(secrets: Sequence[str | None] = ()) -> Script | None:
    """The user's script that `__main__` runs now (not a console script, not torchdoctor's or
    another package's entry point), read at this moment; None when there is none. Its text
    and arguments are redacted, the `secrets` known by value too."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return None
    path = os.path.abspath(path)
    if not frames.is_user_file(path):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE + 1)
            digest = hashlib.sha256(data)
            size = len(data)
            while chunk := f.read(1 << 20):  # a huge file: hashed whole, not kept
                digest.update(chunk)
                size += len(chunk)
    except OSError:
        return None
    text = None
    if size <= MAX_SOURCE:
        try:
            text = redact.redact_text(data.decode("utf-8"), secrets)
        except UnicodeDecodeError:
            text = None
    return Script(path, digest.hexdigest(), size, text, redact.redact_argv(sys.argv, secrets))


@dataclasses.dataclass(frozen=True)
class Moment:
    """The machine and this process at one moment: what makes timings slower whatever the
    code does (a busy machine: the main thread waits, runnable, for a CPU)."""

    time: float
    load: float | None  # the machine's 1-minute load average
    cpu: float | None  # seconds the main thread has run on a CPU
    wait: float | None  # seconds it has waited, runnable, for one (the scheduler's run queue)


def moment() -> Moment:
    cpu = wait = load = None
    try:
        load = round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        pass
    try:  # /proc/PID/schedstat: the main thread's run time, run-queue wait, time slices (ns)
        with open(f"/proc/{os.getpid()}/schedstat") as f:
            fields = f.read().split()
        cpu, wait = int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    return Moment(time.time(), load, cpu, wait)


def facts(
    script: Script | None, start: Moment, steps: Moment | None, env: dict[str, str]
) -> dict[str, Any]:
    """What meta.json gets: `environment` (`env`, as it was when the run started: not what the
    script or torch set since), `torch`, `machine` (a Moment when the run started, one when its
    first step ended, and one at this write) and, when known, `script`."""
    build = machine.torch_build()
    busy = {"start": dataclasses.asdict(start), "last": dataclasses.asdict(moment())}
    if steps is not None:
        busy["steps"] = dataclasses.asdict(steps)
    out: dict[str, Any] = {"environment": env, "torch": build, "machine": busy}
    if script is not None:
        out["script"] = script.facts()
    return out
