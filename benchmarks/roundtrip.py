"""Round trips to a live probe: `backtrace` of a target with 20 threads, and simple queries.

Budgets (docs/benchmarks.md): backtrace <= 100 ms; query <= 200 ms (the 1M-row GROUP BY is in
overhead.py). The target is a real training script in its own process; the client is the
CLI's own client, without the interpreter start-up of a CLI process (printed separately).
Run: .venv/bin/python benchmarks/roundtrip.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from torchdoctor.cli.client import Address, ProbeClient

ROOT = Path(__file__).resolve().parent.parent
BUDGETS = {"backtrace": 0.100, "query": 0.200}


def timed(fn: Callable[[], object], n: int = 30) -> tuple[float, float]:
    fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), max(times)


def report(what: str, med: float, worst: float, budget: float | None = None) -> None:
    line = f"{what}: median {med * 1e3:.1f} ms, max {worst * 1e3:.1f} ms"
    if budget:
        line += f" (budget <= {budget * 1e3:.0f} ms; ratio to budget {med / budget:.2f})"
    print(line)


def main() -> None:
    sockets = tempfile.mkdtemp(prefix="td-")
    env = dict(os.environ, TORCHDOCTOR_SOCKET_DIR=sockets, OMP_NUM_THREADS="1")
    script = str(ROOT / "tests/scripts/trainer.py")
    command = [sys.executable, "-m", "torchdoctor", "run", "--quiet", script]
    command += ["--threads", "19", "--pause", "0.005"]
    target = subprocess.Popen(
        command, env=env, cwd=tempfile.mkdtemp(prefix="td-bench-"), stdout=subprocess.DEVNULL
    )
    try:
        entry = Path(sockets) / f"{target.pid}.json"
        deadline = time.monotonic() + 60
        while not entry.exists():  # another process: poll until its probe registers
            if time.monotonic() > deadline or target.poll() is not None:
                raise SystemExit("the target did not start")
            time.sleep(0.05)
        socket = json.loads(entry.read_text())["socket"]
        client = ProbeClient(Address("bench", socket_path=socket))
        count = {"sql": "SELECT count(*) FROM python.threads WHERE NOT probe"}
        threads = 0
        while threads < 20:  # the script starts its idle threads after the probe is up
            if time.monotonic() > deadline:
                raise SystemExit("the target's threads did not start")
            threads = client.request("POST", "/v1/query", count)[1]["rows"][0][0]
        med, worst = timed(lambda: client.request("GET", "/v1/backtrace"))
        report(f"backtrace round trip, {threads} threads", med, worst, BUDGETS["backtrace"])
        sql = "SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10"
        med, worst = timed(lambda: client.request("POST", "/v1/query", {"sql": sql}))
        report("query over python.backtrace", med, worst, BUDGETS["query"])
        sql = "SELECT count(*), avg(duration) FROM python.steps"
        med, worst = timed(lambda: client.request("POST", "/v1/query", {"sql": sql}))
        report("query over python.steps", med, worst, BUDGETS["query"])
        t0 = time.perf_counter()
        cli = [sys.executable, "-m", "torchdoctor", str(target.pid), "backtrace"]
        subprocess.run(cli, env=env, stdout=subprocess.DEVNULL, check=True)
        took = (time.perf_counter() - t0) * 1e3
        print(f"`torchdoctor PID backtrace` as a CLI process, start-up included: {took:.0f} ms")
    finally:
        target.kill()
        target.wait()


if __name__ == "__main__":
    main()
