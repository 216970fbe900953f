"""`TORCHDOCTOR=1 python train.py`: started by the torchdoctor.pth line at interpreter start-up.

The probe starts once the script imports torch, so plain Python processes (pip, tools, our own
CLI) never start one. Left alone: torchrun's launcher (its workers are probed instead) and the
torchdoctor command itself.

Multiprocessing children (spawned processes: DataLoader workers and torch.multiprocessing.spawn
ranks alike) are not probed at start. They are probed when they call `init_process_group`,
that is when they turn out to be ranks, and only if TORCHDOCTOR=1 is in their environment or
the process that launched them is probed (`torchdoctor run` of a script that uses mp.spawn).
DataLoader workers never call it, so they never are.
"""

from __future__ import annotations

import os
import sys

_OFF = {"", "0", "false", "no", "off"}


def wanted(argv: list[str], env: dict[str, str] | os._Environ[str]) -> bool:
    if env.get("TORCHDOCTOR", "").strip().lower() in _OFF:
        return False
    joined = " ".join(argv)
    if "--multiprocessing-fork" in argv or ("multiprocessing" in joined and "-c" in argv):
        return False
    script = os.path.basename(argv[1]) if len(argv) > 1 else ""
    if script in ("torchrun", "torchdoctor") or script.startswith("torchdoctor"):
        return False
    if "-m" in argv:
        module = argv[argv.index("-m") + 1] if argv.index("-m") + 1 < len(argv) else ""
        if module in ("torch.distributed.run", "torch.distributed.launch", "torchdoctor"):
            return False
    return True


def rank_child(argv: list[str], env: dict[str, str] | os._Environ[str]) -> bool:
    """A spawned multiprocessing child that is to be probed if it becomes a rank."""
    if "--multiprocessing-fork" not in argv:
        return False
    if env.get("TORCHDOCTOR", "").strip().lower() not in _OFF:
        return True
    from torchdoctor import registry

    try:
        return registry.find(os.getppid()) is not None
    except Exception:
        return False


def _arm(_module: object) -> None:
    """In a spawned child: wait for init_process_group, which starts the probe (a rank)."""
    from torchdoctor.telemetry import process_group

    def on_rank(identity: object) -> None:
        from torchdoctor import session

        session.on_rank(identity)  # type: ignore[arg-type]

    process_group.install(on_rank)


def _autostart() -> None:
    if getattr(sys, "_torchdoctor_autostart", False):
        return  # the .pth line can run twice (editable installs)
    sys._torchdoctor_autostart = True  # type: ignore[attr-defined]
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if not wanted(argv, os.environ):
        try:
            if rank_child(argv, os.environ):
                from torchdoctor.telemetry.on_import import when_imported

                when_imported("torch", _arm)
        except Exception as exc:
            sys.stderr.write(f"torchdoctor: start-up hook failed: {exc}\n")
        return
    try:
        from torchdoctor.telemetry.on_import import when_imported

        def start(_module: object) -> None:
            from torchdoctor import session

            try:
                session.start()
            except Exception as exc:
                sys.stderr.write(f"torchdoctor: not started: {type(exc).__name__}: {exc}\n")

        when_imported("torch", start)
    except Exception as exc:  # never stop the user's program from starting
        sys.stderr.write(f"torchdoctor: start-up hook failed: {exc}\n")


_autostart()
