"""What torchdoctor's own processes import before they do anything: the CLI's parsers load no
numpy, duckdb or torch, and a probe starting in a training process loads none of the modules
that judge its records (those load at the doctor's first pass, at exit, or when asked). Each
check runs in a fresh interpreter: this one has imported everything already."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from torchdoctor import doctor
from torchdoctor.diagnose import MODULES

# Loaded when first used, never as the probe starts: every diagnosis (the doctor runs them),
# the job-level views of a rank (once it is one), what names the holders of leaking memory.
JUDGING = (
    *(f"torchdoctor.diagnose.{name}" for name in MODULES),
    "torchdoctor.cluster.gather",
    "torchdoctor.cluster.state",
    "torchdoctor.cluster.saved",
    "torchdoctor.memory.holders",
)


def _modules_after(code: str, env: dict[str, str]) -> dict[str, Any]:
    """Run `code` in a fresh interpreter; it prints a JSON object with "modules" last."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def test_building_the_cli_parsers_imports_no_heavy_library(env: dict[str, str]) -> None:
    out = _modules_after(
        """
        import contextlib, io, json, sys
        from torchdoctor.cli.main import COMMANDS, main

        with contextlib.redirect_stdout(io.StringIO()):
            main(["--help"])  # reads every verb's SUMMARY
            for verb in COMMANDS:  # builds each verb's parser, as running it does
                try:
                    main([verb, "--help"])
                except SystemExit:
                    pass
        print(json.dumps({"modules": sorted(sys.modules)}))
        """,
        env,
    )
    loaded = set(out["modules"])
    assert "torchdoctor.cli.commands.report" in loaded  # the verbs were all imported
    assert sorted({"numpy", "duckdb", "torch"} & loaded) == []


def test_a_probe_starts_without_its_judging_modules(env: dict[str, str], tmp_path: Path) -> None:
    # TORCHDOCTOR=1: the .pth line's autostart starts the probe as the script imports torch
    # (the Recorder on a side thread once that import has finished).
    probed = dict(env, TORCHDOCTOR="1", TORCHDOCTOR_RUN_DIR=str(tmp_path / "run"))
    for _try in range(3):
        out = _modules_after(
            """
            import json, sys, time
            import torch
            from torchdoctor import session

            s = session.current()
            while s is not None and s.telemetry is None and time.time() - s.started < 30:
                time.sleep(0.01)
            modules = sorted(sys.modules)
            print(json.dumps({
                "started": s is not None and s.telemetry is not None and s.doctor is not None,
                "seconds": time.time() - s.started if s is not None else None,
                "modules": modules,
            }))
            """,
            probed,
        )
        assert out["started"], out.get("seconds")
        if out["seconds"] < doctor.TICK:
            break  # taken before the doctor's first pass could begin
    else:
        raise AssertionError("the probe took a doctor's tick or more to start, three times")
    loaded = set(out["modules"])
    assert "torchdoctor.telemetry.recorder" in loaded
    assert sorted(loaded.intersection(JUDGING)) == []
