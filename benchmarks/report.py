"""How long `torchdoctor report` and `torchdoctor export --perfetto` take on a run of a million
steps, and how big their files are (the report's budget: under 5 MB).

The run is synthetic, written with the project's own segment writer (tests/synthetic.py): one
row per step, module calls and gradient norms on one step in 20, two diagnoses. Each command
runs as a user would run it, in its own process, interpreter start-up included.
Run: .venv/bin/python benchmarks/report.py [STEPS]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from synthetic import write_run  # noqa: E402


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    td = [sys.executable, "-m", "torchdoctor"]
    with tempfile.TemporaryDirectory() as tmp:
        run = write_run(Path(tmp) / "run", steps, spike_at=steps // 3, nan_at=2 * steps // 3)
        on_disk = sum(p.stat().st_size for p in run.rglob("*") if p.is_file())
        print(f"run: {steps:,} steps, {on_disk / 1e6:.0f} MB on disk")
        page = Path(tmp) / "report.html"
        seconds = timed([*td, "report", str(run), "-o", str(page)])
        size = page.stat().st_size
        print(f"report: {seconds:.1f} s, {size / 1e6:.2f} MB (budget < 5 MB; {size / 5e6:.2f})")
        trace = Path(tmp) / "trace.json"
        seconds = timed([*td, "export", str(run), "--perfetto", str(trace)])
        print(f"export --perfetto: {seconds:.1f} s, {trace.stat().st_size / 1e6:.0f} MB")
        out = Path(tmp) / "pq"
        seconds = timed([*td, "export", str(run), "--parquet", str(out)])
        size = sum(p.stat().st_size for p in out.iterdir())
        print(f"export --parquet: {seconds:.1f} s, {size / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
