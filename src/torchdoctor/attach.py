"""Start the probe inside a running Python process that was started without it.

Python >= 3.14 has `sys.remote_exec`; elsewhere on Linux, gdb calls into the interpreter
(PyGILState_Ensure, PyRun_SimpleString) to run a few lines that start the probe. Both need
ptrace rights over the target: the same user with kernel.yama.ptrace_scope 0, or root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


class AttachError(Exception):
    pass


def bootstrap_code(options: dict[str, Any]) -> str:
    """The code run inside the target: make torchdoctor importable there, then start it.

    The work happens on a new thread: the main thread may be halfway through importing
    numpy or torch, and import locks make the new thread wait for that import to finish.
    Nothing may raise out of this code: an exception escaping a pending call would be
    raised into whatever the main thread was running.
    """
    package_root = str(Path(__file__).resolve().parent.parent)  # what holds the package
    return (
        "import os, sys, threading\n"
        "def _torchdoctor_attach():\n"
        "    try:\n"
        "        try:\n"
        "            import torchdoctor\n"
        "        except ImportError:\n"
        f"            sys.path.append({package_root!r})\n"
        "            import torchdoctor\n"
        f"        torchdoctor.start(**{json.dumps(options)!s}).note_attached()\n"
        "    except BaseException as exc:\n"
        "        sys.stderr.write(f'torchdoctor: attach failed: {type(exc).__name__}: {exc}\\n')\n"
        "try:\n"
        "    os.unlink(__file__)\n"
        "    threading.Thread(target=_torchdoctor_attach, name='torchdoctor-attach',"
        " daemon=True).start()\n"
        "except BaseException as exc:\n"
        "    sys.stderr.write(f'torchdoctor: attach failed: {exc}\\n')\n"
    )


def ptrace_problem(pid: int) -> str | None:
    """Why ptrace will fail, when that can be told in advance."""
    try:
        scope = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        scope = 0
    if os.geteuid() == 0:
        return None
    try:
        target_uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        target_uid = os.getuid()
    if target_uid != os.getuid():
        return f"process {pid} belongs to uid {target_uid}; only that user (or root) can attach"
    if scope >= 2:
        return (
            f"ptrace is restricted to root (kernel.yama.ptrace_scope={scope}); run as root, "
            "or start the script with `torchdoctor run` or TORCHDOCTOR=1"
        )
    if scope == 1:
        return (
            "ptrace is restricted to parent processes (kernel.yama.ptrace_scope=1); run "
            "`sudo sysctl kernel.yama.ptrace_scope=0`, attach as root, or start the script "
            "with `torchdoctor run` or TORCHDOCTOR=1"
        )
    return None


def inject(pid: int, code: str, direct: bool = False, timeout: float = 60.0) -> None:
    """Have the target run `code`.

    By default the code is queued as a pending call (Py_AddPendingCall): the main thread runs
    it at its next bytecode boundary, a safe point. A main thread stuck in C never reaches
    one; `direct=True` then runs it from the stopped thread at once (PyGILState_Ensure +
    PyRun_SimpleString), which is safe while that thread waits in a system call.
    """
    fd, path = tempfile.mkstemp(prefix="torchdoctor-attach-", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write(code)
    os.chmod(path, 0o644)  # the target may run as another user when we are root
    # Left in place: a pending call reads it later. Removed by the code itself once it ran.
    if hasattr(sys, "remote_exec") and _same_python(pid) and not direct:
        sys.remote_exec(pid, path)
        return
    _inject_gdb(pid, path, direct, timeout)


def _same_python(pid: int) -> bool:
    try:
        return os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(sys.executable)
    except OSError:
        return False


REGISTERS_REFUSED = "Couldn't write extended state status"


def _calls_refused(gdb: str) -> str | None:
    """Why gdb cannot call a function in a process on this machine, tried on a throwaway child
    first: some kernels (seen on Firecracker VMs) refuse a tracer's write of the FPU/vector
    registers, which every call needs, and the training process is not where to find out."""
    child = subprocess.Popen(["sleep", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        out = subprocess.run(
            [gdb, "--batch", "-nx", "-iex", "set auto-solib-add off", "-p", str(child.pid),
             "-ex", "call (int)getpid()", "-ex", "detach"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None  # no answer either way: the attach itself will say
    finally:
        child.kill()
        child.wait()
    if REGISTERS_REFUSED in out.stdout + out.stderr:
        return (
            "gdb cannot call functions in a process on this machine: the kernel refuses to "
            f"write a traced process's FPU/vector registers (gdb: {REGISTERS_REFUSED!r}), "
            "so nothing was done to the process. Start the script with `torchdoctor run` or "
            "TORCHDOCTOR=1 instead"
        )
    return None


def _inject_gdb(pid: int, script: str, direct: bool, timeout: float) -> None:
    gdb = shutil.which("gdb")
    if gdb is None:
        raise AttachError(
            "gdb is not installed (apt install gdb / dnf install gdb); or start the script "
            "with `torchdoctor run` or TORCHDOCTOR=1"
        )
    problem = ptrace_problem(pid) or _calls_refused(gdb)
    if problem:
        raise AttachError(problem)
    # No string literal is passed to a called function: gdb would malloc() room for it in
    # the target, which deadlocks or crashes if the target was stopped inside malloc. The
    # code goes into a fresh anonymous mapping with `restore` instead.
    line = f"exec(open({script!r}).read(), {{'__name__': '__torchdoctor_attach__', "
    line += f"'__file__': {script!r}}})"
    blob = script + ".bin"
    with open(blob, "wb") as f:
        f.write(line.encode() + b"\0")
    calls = ["call (void*)mmap(0, 65536, 3, 34, -1, 0)", f"restore {blob} binary $1"]
    if direct:
        calls += [
            "call (int)PyGILState_Ensure()",
            "call (int)PyRun_SimpleString((char*)$1)",
            "call (void)PyGILState_Release($2)",
        ]
    else:
        calls.append("call (int)Py_AddPendingCall((int(*)(void*))PyRun_SimpleString, $1)")
    # Load symbols of libc and libpython only: reading those of torch takes seconds.
    command = [gdb, "--batch", "-nx", "-iex", "set auto-solib-add off", "-p", str(pid)]
    command += ["-ex", "set confirm off", "-ex", "sharedlibrary libc\\.so"]
    command += ["-ex", "sharedlibrary libpython"]
    for call in [*calls, "detach"]:
        command += ["-ex", call]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AttachError(f"gdb did not finish within {timeout:g} s") from None
    finally:
        os.unlink(blob)
    text = out.stdout + out.stderr
    if "ptrace: Operation not permitted" in text or "Could not attach" in text:
        raise AttachError(
            "ptrace refused (Operation not permitted): attach as the process's user with "
            "kernel.yama.ptrace_scope=0, or as root; inside containers add CAP_SYS_PTRACE. "
            "Or start the script with `torchdoctor run` or TORCHDOCTOR=1"
        )
    if "No symbol" in text:
        raise AttachError(
            f"process {pid} does not look like a Python interpreter gdb can call into "
            f"(no Python C-API symbols):\n{text.strip()[-600:]}"
        )
    last = "$3 = " if direct else "$2 = "
    if f"{last}-1" in text:
        raise AttachError("the target refused the call (see its stderr)")
    if last not in text:
        raise AttachError(f"gdb failed:\n{text.strip()[-800:]}")
