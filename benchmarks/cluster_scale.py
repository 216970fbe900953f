"""How the job-level answers grow with ranks: a simulated hung job (tests/simjob.py: rank
directories written by torchdoctor's own writers, every rank but one waiting in all_reduce #57,
one stuck in its data read; stand-in endpoints, one TCP port per rank in one process) of N
ranks, and the wall time and line count of `cluster backtrace`, `cluster diagnoses` (from rank
0's endpoint) and `diagnoses JOB_DIR` (the job stopped as a whole afterwards), best of 3 runs
of the real CLI. Budget (docs/benchmarks.md): 256 ranks within 2 s and 30 lines each.

    .venv/bin/python benchmarks/cluster_scale.py [--ranks 2,16,64,256,1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from simjob import write_job  # noqa: E402


def run(argv: list[str], repeat: int) -> tuple[float, int]:
    """(best wall time, lines of output) of the CLI."""
    best, lines = float("inf"), 0
    for _ in range(repeat):
        began = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "torchdoctor", *argv], capture_output=True, text=True
        )
        best = min(best, time.perf_counter() - began)
        assert out.returncode == 0, out.stderr
        lines = len(out.stdout.splitlines())
    return best, lines


def measure(world: int, repeat: int) -> dict[str, tuple[float, int]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        live = write_job(root / "live", world)
        stopped = write_job(root / "stopped", world, stopped=True)
        ports = root / "ports.json"
        server = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "simjob.py"), "serve", str(live), str(ports)]
        )
        try:
            deadline = time.monotonic() + 120
            while not ports.exists():
                assert server.poll() is None and time.monotonic() < deadline, "no stand-ins"
                time.sleep(0.05)
            info = json.loads(ports.read_text())
            target = ["-t", f"127.0.0.1:{info['ports'][0]}", "--token", info["tokens"][0]]
            return {
                "cluster backtrace": run([*target, "cluster", "backtrace"], repeat),
                "cluster diagnoses": run([*target, "cluster", "diagnoses"], repeat),
                "diagnoses JOB_DIR": run(["diagnoses", str(stopped)], repeat),
            }
        finally:
            server.kill()
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", default="2,16,64,256,1024")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    verbs = ("cluster backtrace", "cluster diagnoses", "diagnoses JOB_DIR")
    print(f"{'ranks':>6}  " + "  ".join(f"{v:>24}" for v in verbs))
    for world in (int(n) for n in args.ranks.split(",")):
        got = measure(world, args.repeat)
        cells = [f"{got[v][0]:6.2f} s {got[v][1]:3d} lines" for v in verbs]
        print(f"{world:>6}  " + "  ".join(f"{c:>24}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
