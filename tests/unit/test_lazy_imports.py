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


def test_a_probe_loads_its_judging_modules_off_the_scripts_thread(
    env: dict[str, str], tmp_path: Path
) -> None:
    # TORCHDOCTOR=1: the .pth line's autostart starts the probe as the script imports torch.
    # A finder put first on sys.meta_path notes which thread imports each module; the judging
    # modules must come from the doctor's thread (as it starts), none from the script's.
    probed = dict(env, TORCHDOCTOR="1", TORCHDOCTOR_RUN_DIR=str(tmp_path / "run"))
    out = _modules_after(
        """
        import json, sys, threading, time

        importers = {}

        class Note:
            @staticmethod
            def find_spec(name, path=None, target=None):
                importers.setdefault(name, threading.current_thread().name)
                return None

        sys.meta_path.insert(0, Note)
        import torch
        from torchdoctor import session

        s = session.current()
        doctor = s.doctor if s is not None else None
        while doctor is not None and time.time() - s.started < 60:
            if doctor.modules and s.telemetry is not None:
                break
            time.sleep(0.01)
        print(json.dumps({
            "started": s is not None and s.telemetry is not None,
            "loaded": len(doctor.modules) if doctor is not None else 0,
            "modules": importers,
        }))
        """,
        probed,
    )
    assert out["started"] and out["loaded"] > 10, out["loaded"]
    importers = out["modules"]
    assert "torchdoctor.telemetry.recorder" in importers
    judging = {name: importers[name] for name in JUDGING if name in importers}
    assert judging, "the doctor loaded no diagnosis module"
    on_main = sorted(name for name, thread in judging.items() if thread == "MainThread")
    assert on_main == []


def test_the_first_pass_s_loading_is_not_counted_as_its_cost(env: dict[str, str]) -> None:
    # The doctor spaces its passes by what the last few cost; the first one loads the
    # diagnosis modules (about a tenth of a second), and counted as a pass that would put the
    # second pass LONGEST_WAIT later, past the hang a rank is to report meanwhile.
    out = _modules_after(
        """
        import json, sys, time
        from torchdoctor.doctor import Doctor
        from torchdoctor.config import Config
        from torchdoctor.store.tables import Tables

        class Host:
            tables, config, started = Tables(), Config(), time.time()
            waiting, resumed, telemetry = False, 0.0, None
            def save_diagnoses(self): pass
            def alert(self, diagnosis): pass
            def job(self): return None

        doctor = Doctor(Host())
        began = time.thread_time()
        cost = doctor._timed_pass()
        total = time.thread_time() - began
        print(json.dumps({"cost": cost, "total": total, "loaded": len(doctor.modules),
                          "modules": sorted(sys.modules)}))
        """,
        env,
    )
    assert out["loaded"] > 10
    assert out["cost"] < out["total"] / 2, out["cost"]
