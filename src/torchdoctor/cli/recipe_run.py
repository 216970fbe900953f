"""Running a script under a recipe (overfit, repro): the verb starts `python -m
torchdoctor.cli.recipe_run SCRIPT ARGS...` (or `-m MODULE ARGS...`) with the recipe's spec in
TORCHDOCTOR_RECIPE; that process starts the probe, switches the recipe's mode on, runs the
script as `python SCRIPT ARGS` would, and writes what the mode found to the spec's `out` file.

The spec is taken out of the environment before the script runs: the script and anything it
starts see the environment the user gave. A normal `torchdoctor run` never comes here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchdoctor.telemetry.recorder import Recorder

ENV = "TORCHDOCTOR_RECIPE"


# -- the verb's side ---------------------------------------------------------------------------
def spawn(
    spec: dict[str, Any],
    target: list[str],
    json_output: bool,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any] | None, int]:
    """Run the target under the recipe in a child process: (its result, or None when it
    wrote none, and the child's exit code). With `json_output`, the script's stdout goes to
    stderr, so that stdout carries only the verb's JSON."""
    with tempfile.TemporaryDirectory(prefix="torchdoctor-recipe-") as tmp:
        out = Path(tmp) / "result.json"
        child_env = dict(os.environ if env is None else env)
        child_env.pop("TORCHDOCTOR", None)  # the probe is started here, not by the import hook
        child_env[ENV] = json.dumps({**spec, "out": str(out), "dir": tmp})
        argv = [sys.executable, "-m", "torchdoctor.cli.recipe_run", *target]
        sys.stdout.flush()
        proc = subprocess.run(argv, env=child_env, stdout=sys.stderr if json_output else None)
        try:
            result = json.loads(out.read_text())
        except (OSError, ValueError):
            result = None
    return result, proc.returncode


# -- the child's side --------------------------------------------------------------------------
def child(argv: list[str]) -> int:
    spec = json.loads(os.environ.pop(ENV))
    from torchdoctor import session
    from torchdoctor.cli import script
    from torchdoctor.config import from_env

    probe = session.start(from_env().replace(quiet=True))
    import torch

    from torchdoctor.recipes.mode import StopTraining

    recorder = probe.telemetry
    if recorder is None:
        _write(spec, {"error": "torchdoctor's telemetry could not start in this process"})
        probe.stop(1)
        return 1
    mode = _mode(spec, recorder, torch)
    if argv and argv[0] == "-m":
        outcome = script.run_module(argv[1], argv[2:], silent=(StopTraining,))
    else:
        outcome = script.run_script(argv[0], argv[1:], silent=(StopTraining,))
    stopped = isinstance(outcome.exception, StopTraining)
    mode.disarm()
    try:
        result = mode.result()
    finally:
        mode.remove()
    crash = outcome.exception if not stopped and not outcome.interrupted else None
    if crash is not None:
        probe.report_crash(crash)
    probe.stop(0 if stopped else outcome.code)
    result["script"] = {
        "stopped_by_torchdoctor": stopped,
        "exit_code": None if stopped else outcome.code,
        "exception": f"{type(crash).__name__}: {crash}"[:500] if crash is not None else None,
        "interrupted": outcome.interrupted,
    }
    result["run_dir"] = str(probe.run_dir)
    result["diagnoses"] = [
        {
            "kind": d.kind,
            "severity": d.severity,
            "step": d.step,
            "location": d.location,
            "summary": d.summary,
        }
        for d in probe.diagnoses()
    ]
    _write(spec, result)
    return 130 if outcome.interrupted else 0


def _mode(spec: dict[str, Any], recorder: Recorder, torch: Any) -> Any:
    if spec["kind"] == "overfit":
        from torchdoctor.recipes.overfit import OverfitMode

        return OverfitMode(recorder, torch, int(spec["steps"]))
    from torchdoctor.recipes.repro import ReproMode

    return ReproMode(recorder, torch, int(spec["steps"]))


def _write(spec: dict[str, Any], result: dict[str, Any]) -> None:
    from torchdoctor._json import dumps

    Path(spec["out"]).write_text(dumps(result))


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))
