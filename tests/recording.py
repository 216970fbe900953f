"""Recording a training script in the test's own process, as memray's tests track in-process:
`record(script, *args, run_dir=...)` runs the script as `torchdoctor run` would (its own
`__main__`, argv and sys.path[0], through torchdoctor's runner) inside a
`torchdoctor.Session`, then puts back what a script may change in the process (the working
directory, argv, sys.path, `__main__`, torch's global settings, the random generators), so
that the next test starts as this one did. The run directory is then judged like any saved
run. A test needs a separate process only when the process is what is tested (its exit, its
signals, its stdout byte for byte, a stuck process questioned live, several ranks).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from helpers import SCRIPTS


@dataclasses.dataclass
class Recorded:
    run_dir: Path
    code: int  # what the process would have exited with
    session: Any  # the torchdoctor.Session, stopped: summary(), diagnoses()
    exception: BaseException | None

    def diagnoses(self) -> list[dict[str, Any]]:
        """The findings as saved (diagnoses.jsonl), the latest report of each last."""
        import json

        path = self.run_dir / "diagnoses.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextlib.contextmanager
def process_state(cwd: Path) -> Iterator[None]:
    """Run in `cwd`, then restore what a training script may change in the process."""
    import numpy as np
    import torch

    saved_main = sys.modules.get("__main__")
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    saved_cwd = os.getcwd()
    saved_modules = set(sys.modules)
    saved_torch = (
        torch.get_num_threads(),
        torch.get_default_dtype(),
        torch.is_grad_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_rng_state(),
    )
    saved_random = (random.getstate(), np.random.get_state())
    os.chdir(cwd)
    torch.set_num_threads(1)  # as the subprocesses' OMP_NUM_THREADS=1: workers share 2 cores
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        # modules the script imported from its own directory (tests/scripts helpers) are
        # loaded again by the next script, as a new process would
        for name in set(sys.modules) - saved_modules:
            module = sys.modules.get(name)
            if str(getattr(module, "__file__", "") or "").startswith(str(SCRIPTS)):
                del sys.modules[name]
        threads, dtype, grad, deterministic, rng = saved_torch
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.use_deterministic_algorithms(deterministic)
        torch.set_rng_state(rng)
        random.setstate(saved_random[0])
        np.random.set_state(saved_random[1])


def record(
    script: str | Path,
    *args: str,
    run_dir: Path,
    cwd: Path | None = None,
    **options: Any,
) -> Recorded:
    """Run tests/scripts/`script` (or a path) with `args` under a Session recording into
    `run_dir`; `options` are the Session's (guard=True, hang_timeout=2, trace_every=1, ...)."""
    import torchdoctor
    from torchdoctor.cli.script import run_script

    path = Path(script) if os.path.isabs(script) else SCRIPTS / script
    cwd = cwd or run_dir.parent
    cwd.mkdir(parents=True, exist_ok=True)
    options.setdefault("quiet", True)
    with process_state(cwd), torchdoctor.Session(run_dir, **options) as session:
        outcome = run_script(str(path), list(args))
        session.exit_code = outcome.code
        if outcome.exception is not None:
            session.report_crash(outcome.exception)
    return Recorded(run_dir, outcome.code, session, outcome.exception)
