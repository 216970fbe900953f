"""A million tiny optimizer steps under `torchdoctor run`: the probe's memory (RSS, from /proc)
and the run directory's size, every 100,000 steps, and the step rate between checkpoints.

The tables keep at most their capacity (1,000,000 rows for the big ones; --max-rows sets
TORCHDOCTOR_MAX_ROWS to show the plateau sooner) in memory and on disk (rotated files), so
both figures must level off once the tables are full. --plain runs the same script without
torchdoctor first, for the step rate and memory it has on its own.
Run: .venv/bin/python benchmarks/soak.py [--steps N] [--every N] [--max-rows N] [--plain]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "tiny_steps.py"


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def size(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def soak(steps: int, every: int, max_rows: int | None, probed: bool) -> None:
    work = Path(tempfile.mkdtemp(prefix="td-soak-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    env["TORCHDOCTOR_SOCKET_DIR"] = str(work / "s")
    env["OMP_NUM_THREADS"] = "1"
    if max_rows:
        env["TORCHDOCTOR_MAX_ROWS"] = str(max_rows)
    run_dir = work / "run"
    points = list(range(every, steps + 1, every))
    argv = [str(SCRIPT), "--steps", str(steps), "--checkpoints", ",".join(map(str, points))]
    prefix = ["-m", "torchdoctor", "run", "--quiet", "--run-dir", str(run_dir)] if probed else []
    proc = subprocess.Popen(
        [sys.executable, *prefix, *argv], cwd=work, env=env, stdout=subprocess.PIPE, text=True
    )
    label = "torchdoctor" if probed else "plain"
    if max_rows:
        label += f", TORCHDOCTOR_MAX_ROWS={max_rows}"
    print(f"\n{label}")
    print(f"{'steps':>10} {'RSS MiB':>8} {'run dir MiB':>11} {'files':>5} {'us/step':>8}")
    assert proc.stdout is not None
    last = None
    for line in proc.stdout:
        if not line.startswith("checkpoint"):
            continue
        n = int(line.split()[1])
        now = time.perf_counter()
        if probed:
            time.sleep(2.5)  # the spill thread writes every second: let it catch up
        mem = rss(proc.pid)
        disk, files = size(run_dir) if probed else (0, 0)
        rate = f"{(now - last[1]) / (n - last[0]) * 1e6:8.1f}" if last else f"{'':>8}"
        print(f"{n:>10,} {mem / 2**20:8.1f} {disk / 2**20:11.1f} {files:>5} {rate}", flush=True)
        last = (n, time.perf_counter())
        (work / f"go-{n}").touch()
    proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--max-rows", type=int)
    parser.add_argument("--plain", action="store_true")
    args = parser.parse_args()
    if args.plain:
        soak(args.steps, args.every, None, probed=False)
    soak(args.steps, args.every, args.max_rows, probed=True)


if __name__ == "__main__":
    main()
