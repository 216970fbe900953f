"""A script under torchdoctor behaves exactly as without it.

Every script of tests/transparency runs plain and under `torchdoctor run`, and where the way in
matters also under `TORCHDOCTOR=1 python` (ENV_TOO), each in a fresh directory.
Same exit code, same stdout byte for byte
(seeded losses printed in full precision; the compiled scripts print Dynamo's own counters),
same stderr once torchdoctor's own lines are taken out, same files with the same bytes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT, free_port, strip_ours

CORPUS = ROOT / "tests" / "transparency"
TORCHDOCTOR = str(Path(sys.executable).with_name("torchdoctor"))
WAYS = ("plain", "run", "env")
ADDRESS_IN_USE = "address already in use"  # gloo's and the TCP store's words for EADDRINUSE
# Python's own race at a spawned DataLoader's shutdown: multiprocessing's resource tracker
# warns of a semaphore "leaked" by a worker that was still exiting (a plain run showed it
# once in many suites). Only a plain run that alone shows it is run again; under torchdoctor
# it stays a difference.
SHUTDOWN_RACE = "resource_tracker: There appear to be"
# TORCHDOCTOR=1 starts the probe by another road (the start-up hook at `import torch`) but
# instruments the same way: it runs where the road matters (child processes, import order
# under torch.compile, a plain script run by a relative path, and the endings whose way out
# differs from `run`'s: a message and a traceback Python prints itself, os._exit past atexit,
# a SIGTERM left to its default); the other scripts and endings run plain and under `run`
# (a user's SIGTERM handler, asyncio's and sys.exit(3) take the same code on both roads).
# Keys: (script, its first argument or "").
ENV_TOO = {
    ("compiled_model.py", ""),
    ("loader_workers.py", "fork"),
    ("loader_workers.py", "spawn"),
    ("ddp_spawn.py", "{port}"),
    ("exits.py", "message"),
    ("exits.py", "raise"),
    ("exits.py", "os_exit"),
    ("exits.py", "sigterm"),
    ("as_python.py", ""),
}
# run by a path relative to the working directory, as people type it
RELATIVE = {"as_python.py"}

# (script, arguments, rows of python.steps, optimizers named in python.optimizer_steps: only a
# run of several optimizers has rows there, one per update of each);
# "{port}" becomes a free TCP port. Steps are the primary optimizer's (docs/architecture.md:
# "What a step is"): grad_accumulation's second loop updates by hand after an optimizer has
# stepped, so its 4 manual updates are not steps; ddp_spawn's record is a job directory (its
# two ranks' steps together).
CASES: list[tuple[str, list[str], int, int]] = [
    ("mnist_cnn.py", [], 12, 0),
    ("word_lm.py", [], 10, 0),
    ("manual_regression.py", [], 399, 0),
    ("ema_deepcopy.py", [], 30, 0),
    ("whole_model_pickle.py", [], 10, 0),
    ("script_and_export.py", [], 5, 0),
    ("compiled_model.py", [], 30, 0),
    ("compiled_step.py", [], 25, 0),
    ("loader_workers.py", ["fork"], 8, 0),
    ("loader_workers.py", ["spawn"], 8, 0),
    ("ddp_spawn.py", ["{port}"], 10, 0),
    ("amp_scaler.py", [], 12, 0),
    ("grad_accumulation.py", [], 6, 0),
    ("lbfgs.py", [], 4, 0),
    ("gan.py", [], 8, 2),
    ("custom_function.py", [], 10, 0),
    ("user_hooks.py", [], 6, 0),
    ("exits.py", ["exit"], 4, 0),
    ("exits.py", ["message"], 4, 0),
    ("exits.py", ["os_exit"], 4, 0),
    ("exits.py", ["raise"], 4, 0),
    ("exits.py", ["handler"], 4, 0),
    ("exits.py", ["sigterm"], 4, 0),
    ("exits.py", ["asyncio"], 4, 0),
    ("as_python.py", [], 3, 0),
]


def _argv(way: str, script: Path, args: list[str], cwd: Path) -> list[str]:
    if script.name in RELATIVE:
        script = Path(os.path.relpath(script, cwd))
    if way == "run":
        return [TORCHDOCTOR, "run", str(script), *args]
    return [sys.executable, str(script), *args]


# torch's own log lines start with level, date, time and pid: different in every run
def _digest(path: Path) -> str:
    """The file's bytes; for a TorchScript archive, its code, constants and weights without
    the debug tables (the Python stack at trace time, see docs/architecture.md) and the id
    derived from them."""
    data = path.read_bytes()
    if not zipfile.is_zipfile(path):
        return hashlib.sha256(data).hexdigest()
    with zipfile.ZipFile(path) as archive:
        names = [n for n in sorted(archive.namelist()) if not n.endswith(_DEBUG)]
        if not any("/code/" in n for n in names):  # torch.save's zip: compared whole
            return hashlib.sha256(data).hexdigest()
        digest = hashlib.sha256()
        for name in names:
            digest.update(name.encode() + b"\0" + archive.read(name))
        return digest.hexdigest()


_DEBUG = (".debug_pkl", ".data/serialization_id")


def _files(directory: Path) -> dict[str, str]:
    out = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if rel.parts[0] in ("torchdoctor-runs", "stdout", "stderr") or not path.is_file():
            continue
        out[str(rel)] = _digest(path)
    return out


def _run(way: str, script: Path, args: list[str], cwd: Path, env: dict[str, str]) -> dict:
    """Run `script` one way in its own new directory `cwd`: what it did, and what it left."""
    cwd.mkdir()
    run_env = dict(env, PYTHONHASHSEED="0")  # set orders (TorchScript constants) stay fixed
    if way == "env":
        run_env["TORCHDOCTOR"] = "1"
    proc = subprocess.run(
        _argv(way, script, args, cwd),
        cwd=cwd,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    return {
        "code": proc.returncode,
        "stdout": proc.stdout,
        "stderr": proc.stderr.replace(str(cwd), "<cwd>"),  # each way runs in its own directory
        "files": _files(cwd),
        "probed": (cwd / "torchdoctor-runs").is_dir(),
        "runs": len(list(runs.iterdir())) if (runs := cwd / "torchdoctor-runs").is_dir() else 0,
        "recorded": _recorded(cwd / "torchdoctor-runs"),
    }


def _run_way(way: str, script: Path, args: list[str], tmp_path: Path, env: dict[str, str]) -> dict:
    """_run, with a port of its own for each `{port}`; once more when that port was taken
    between free_port() and the script's bind."""
    for attempt in range(2):
        way_args = [a.replace("{port}", str(free_port())) for a in args]
        where = tmp_path / (way if attempt == 0 else f"{way}-again")
        result = _run(way, script, way_args, where, env)
        if "{port}" not in args or ADDRESS_IN_USE not in result["stderr"].lower():
            break
    return result


def _recorded(runs: Path) -> tuple[int, int] | None:
    """(rows of python.steps, optimizers with rows in python.optimizer_steps) of the run this
    process recorded (its own, not its ranks' or children's)."""
    if not runs.is_dir():
        return None
    from torchdoctor.store.saved import open_run

    own = [d for d in sorted(runs.iterdir()) if (d / "meta.json").is_file()]
    if not own:
        return (0, 0)
    run = open_run(own[0])
    steps = run.block("steps").rows
    optimizers = run.block("optimizer_steps").column("optimizer")
    return int(steps), len(set(optimizers))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("script", "args", "steps", "optimizers"),
    CASES,
    ids=[f"{s[:-3]}-{'-'.join(a) or 'default'}" for s, a, _n, _o in CASES],
)
def test_same_behaviour_with_and_without_torchdoctor(  # type: ignore[no-untyped-def]
    script, args, steps, optimizers, env, tmp_path
) -> None:
    ways = WAYS if (script, args[0] if args else "") in ENV_TOO else WAYS[:2]
    # One way after the other: run at the same time they made the suite slower (2 cores) and
    # the timing-sensitive tests beside them flaky.
    results = {way: _run_way(way, CORPUS / script, args, tmp_path, env) for way in ways}
    if SHUTDOWN_RACE in results["plain"]["stderr"] and not any(
        SHUTDOWN_RACE in results[way]["stderr"] for way in ways[1:]
    ):  # the plain run alone met it: not ours to answer for, so it runs again
        again = tmp_path / "again"
        again.mkdir()  # _run makes the way's own directory in it, not its parents
        results["plain"] = _run_way("plain", CORPUS / script, args, again, env)
    plain = results["plain"]
    assert not plain["probed"]
    for way in ways[1:]:
        probed = results[way]
        assert probed["probed"], f"{way}: torchdoctor did not start\n{probed['stderr']}"
        assert probed["code"] == plain["code"], (
            f"{way}: exit code {probed['code']}, plain {plain['code']}\n"
            f"{way}'s stderr:\n{probed['stderr']}\nplain's stderr:\n{plain['stderr']}"
        )
        assert probed["stdout"] == plain["stdout"], f"{way}: stdout differs"
        assert strip_ours(probed["stderr"]) == strip_ours(plain["stderr"]), f"{way}: stderr"
        assert probed["files"] == plain["files"], f"{way}: files differ"
        # observed, not only harmless: every step of the script is in its tables
        assert probed["recorded"] == (steps, optimizers), f"{way}: {probed['recorded']}"
        # by the script's own process alone: no DataLoader worker (forked, or spawned with
        # TORCHDOCTOR=1 inherited) nor any other child started a probe of its own (ranks write
        # theirs inside the script's directory)
        assert probed["runs"] == 1, f"{way}: {probed['runs']} run directories"


def test_strip_ours_keeps_the_scripts_own_lines() -> None:
    text = (
        "warning from the script\n"
        "torchdoctor: probing pid 1; run directory /x\n"
        "step 1\n"
        "\n"
        "torchdoctor summary\n"
        "  3 steps in 1 s\n"
        "  no problems found\n"
        "Traceback (most recent call last):\n"
        "  File 'x.py', line 1\n"
    )
    assert strip_ours(text) == (
        "warning from the script\nstep 1\n"
        "Traceback (most recent call last):\n  File 'x.py', line 1\n"
    )
