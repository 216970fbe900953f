"""torchdoctor on real public training programs: a scorecard of truthfulness.

Each program of benchmarks/realworld/programs.py (pytorch/examples, its FSDP2 and tensor
parallel examples as torchrun jobs, nanoGPT with and without torch.compile, minGPT, a
Hugging Face Trainer script, a Lightning example, ...) is run on synthetic data
(benchmarks/realworld/data.py, shims/) twice: plain (`python script ARGS`) and under
`torchdoctor run script ARGS` (same cwd, same arguments, a fresh copy each). A program with
`ranks` N runs as `python -m torch.distributed.run --nproc-per-node N --master-port PORT
script ARGS`, under torchdoctor with TORCHDOCTOR=1 and TORCHDOCTOR_RUN_DIR (the job
directory), as the README runs a torchrun job. Then:

- the two runs must match: exit code, stdout (the program's own timing fields normalised,
  and only those: `timing` in programs.py; torch's log lines without their time and pid),
  stderr less torchdoctor's own lines, and every file written, byte for byte (a torchrun
  job's stdout and stderr as sorted line sets: its ranks' lines interleave in no fixed
  order);
- torchdoctor's own lines must hold no internal failure ("telemetry failed", "could not",
  a traceback through torchdoctor's code), counted before those lines are left out;
- the run directory must hold every step (python.steps against the program's own count;
  a torchrun job's, on every rank) and rows for every optimizer (python.optimizer_steps);
- a healthy run raises nothing at warning or error severity (anything is a false alarm).

A program's own bugs are fixed for those runs (`fixes` in programs.py) and run as they are
too (REAL_BUGS in bugs.py, the section "Real bugs found in the public programs as they
are"). Then the bugs of benchmarks/realworld/bugs.py are planted (a small patch to a
temporary copy) and each run once under torchdoctor: found (a diagnosis of an accepted
kind), at the right place (module or file:line), with the right first fix (a key phrase),
and told first (the first warning or error `torchdoctor diagnoses` prints is of that kind,
not a consequence listed before its cause).

The programs are not committed. They are read from local bare mirrors of their repositories
(the search tool's `fetch`, /work/.mirror/<owner>+<name>/repo) into a cache:

    python benchmarks/realworld.py --populate        # mirrors -> cache (+ synthetic data)
    python benchmarks/realworld.py                   # all programs and bugs -> docs/accuracy.md
    python benchmarks/realworld.py --only mnist,dcgan --no-bugs   # a part, printed only
    python benchmarks/realworld.py --device cuda --no-live  # on a GPU (benchmarks/gpu_check.sh)

With `--device cuda` the programs that can use a GPU run on it (`gpu` in programs.py: the
flag each takes, or none where it picks the GPU itself); a difference from the plain run
counts only if a second plain run does not differ from the first as well (GPU kernels need
not add in the same order twice). The scorecard stays the CPU run's.

Without the cache it says how to make it and exits 0 (as benchmarks/lint_corpus.py does
without its mirrors). The whole run takes about 20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from realworld.bugs import BUGS, REAL_BUGS, Bug, Line  # noqa: E402
from realworld.live import LIVE, OVERFIT, LiveCheck, OverfitCheck  # noqa: E402
from realworld.programs import PROGRAMS, Patch, Program, Run, by_name  # noqa: E402

SHIMS = ROOT / "benchmarks" / "realworld" / "shims"
CACHE = Path(
    os.environ.get(
        "TORCHDOCTOR_REALWORLD_CACHE", Path.home() / ".cache" / "torchdoctor" / "realworld"
    )
)
MIRROR = Path(os.environ.get("TORCHDOCTOR_LINT_MIRROR", "/work/.mirror"))
DOC = ROOT / "docs" / "accuracy.md"
STAMP = ".realworld.json"

# torchdoctor's own lines that say it failed inside (the first thing counted).
INTERNAL = re.compile(
    r"telemetry failed|could not|internal error|disabled itself|Traceback \(most recent call",
    re.IGNORECASE,
)
ALERT = re.compile(r"torchdoctor (ERROR|WARNING|INFO) \[")
OUR_FRAME = re.compile(r'File "[^"]*torchdoctor[/\\]')
# torch's own log lines ("W1126 05:04:41.123456 4242 torch/..."): their time and pid go, as
# the transparency tests do (tests/helpers.py strip_ours).
TORCH_LOG = re.compile(r"^([DIWEF])\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ", re.M)


# ---------------------------------------------------------------------------- the cache


def repo_git(mirror: Path, repo: str) -> Path:
    root = mirror / repo.replace("/", "+") / "repo"
    return root / ".git" if (root / ".git").is_dir() else root


def populate(mirror: Path, cache: Path, names: list[str]) -> int:
    """Write each program's files at its commit, and its synthetic data, into the cache."""
    missing = []
    for program in (by_name(n) for n in names):
        git = repo_git(mirror, program.repo)
        if not git.exists():
            missing.append(program.repo)
            print(f"{program.name}: no mirror of {program.repo} at {git}; skipped")
            continue
        root = cache / program.name
        shutil.rmtree(root, ignore_errors=True)
        for path in program.files:
            raw = subprocess.run(
                ["git", "--git-dir", str(git), "show", f"{program.commit}:{path}"],
                capture_output=True,
                check=True,
            ).stdout
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(raw)
        (root / program.workdir).mkdir(parents=True, exist_ok=True)
        if program.data is not None:
            program.data(root)
        stamp = {"repo": program.repo, "commit": program.commit, "files": list(program.files)}
        (root / STAMP).write_text(json.dumps(stamp, indent=1))
        print(f"{program.name}: {program.repo}@{program.commit[:12]} -> {root}")
    if missing:
        print(
            "fetch the missing repositories first (the search tool's fetch: "
            + ", ".join(f"github:{r}" for r in sorted(set(missing)))
            + ")"
        )
    return 0


def cached(cache: Path, program: Program) -> Path | None:
    root = cache / program.name
    if not (root / STAMP).exists():
        return None
    stamp = json.loads((root / STAMP).read_text())
    return root if stamp.get("commit") == program.commit else None


# ---------------------------------------------------------------------------- one run


def free_port() -> int:
    """A port free now, for a torchrun job's rendezvous (two jobs never share one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: int
) -> tuple[int, str, str, bool]:
    """(exit code, stdout, stderr, timed out). In a session of its own: a timeout ends the
    whole process group (a torchrun launcher and its ranks)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return -9, out, err, True


@dataclass
class Outcome:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str
    seconds: float
    workdir: Path
    counter: int
    timed_out: bool = False


def apply(root: Path, patches: tuple[Patch, ...]) -> None:
    for patch in patches:
        path = root / patch.file
        text = path.read_text()
        if text.count(patch.old) != 1:
            raise ValueError(f"{patch.file}: the text to patch occurs {text.count(patch.old)}x")
        path.write_text(text.replace(patch.old, patch.new))


def environment(program: Program, root: Path, extra: dict[str, str], counter: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHDOCTOR")}
    paths = [*(str(SHIMS / s) for s in program.shims), *(str(root / p) for p in program.pythonpath)]
    env.pop("PYTHONPATH", None)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONHASHSEED"] = "0"  # both runs alike: set and dict orders of str keys
    env["REALWORLD_COUNTER"] = str(counter)
    env.update(program.env)
    env.update(extra)
    return env


def run_once(
    program: Program,
    source: Path,
    where: Path,
    doctor_dir: Path | None,
    args: tuple[str, ...],
    patches: tuple[Patch, ...] = (),
    env: dict[str, str] | None = None,
    as_is: bool = False,
) -> Outcome:
    """A fresh copy of the program, run plain or (doctor_dir) under torchdoctor, then kept
    as `where`/root. Every run of a program runs at the same path (`where`'s sibling
    `work`): a program may write its own path into its files (Lightning's checkpoints do).
    `as_is`: with the ports only, the program's own bugs left in (program.fixes not applied)."""
    root = where.parent / "work"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(source, root, ignore=shutil.ignore_patterns(STAMP))
    apply(root, (program.port if as_is else program.healthy) + patches)
    workdir = root / program.workdir
    counter = where.parent / f"{where.name}.counter"
    extra = dict(env or {})
    if program.ranks:
        # torchrun: the way the README runs a job under torchdoctor (every rank probed, the
        # job directory at TORCHDOCTOR_RUN_DIR).
        logs = where.parent / f"{where.name}.torchrun-logs"
        shutil.rmtree(logs, ignore_errors=True)
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(program.ranks),
            "--master-port",
            str(free_port()),
            # each rank's lines through torchrun's own tail, "[rankN]:" before each: whole
            # lines, where two ranks printing to one pipe can cut into each other's line
            "--tee",
            "3",
            "--log-dir",
            str(logs),
            program.script,
            *args,
        ]
        if doctor_dir is not None:
            extra |= {"TORCHDOCTOR": "1", "TORCHDOCTOR_RUN_DIR": str(doctor_dir)}
    elif doctor_dir is None:
        argv = [sys.executable, program.script, *args]
    else:
        argv = [*torchdoctor_cmd(), "run", "--run-dir", str(doctor_dir), program.script, *args]
    start = time.perf_counter()
    rc, out, err, timed_out = spawn(
        argv, workdir, environment(program, root, extra, counter), program.timeout
    )
    seconds = time.perf_counter() - start
    lines = counter.read_text().count("\n") if counter.exists() else 0
    where.mkdir(parents=True, exist_ok=True)
    shutil.move(root, where / "root")
    (where / "stdout.txt").write_text(out)
    (where / "stderr.txt").write_text(err)
    workdir = where / "root" / program.workdir
    return Outcome(argv, rc, out, err, seconds, workdir, lines, timed_out)


# ---------------------------------------------------------------------------- comparing


def normalise(text: str, patterns: tuple[str, ...]) -> str:
    """Numbers inside the matches become #; a match without digits (a progress bar's run of
    blocks, whose length follows the width of the numbers beside it) becomes one block."""

    def blank(m: re.Match[str]) -> str:
        s = m.group(0)
        if not re.search(r"\d", s):
            return s[:1]
        # A number's field width moves the spaces beside it ("{:5.2f}"): those go too.
        return re.sub(r"\s+", " ", re.sub(r"-?\d[\d.]*", "#", s))

    for pattern in patterns:
        text = re.sub(pattern, blank, text)
    return text


def comparable(text: str, program: Program) -> str:
    """An output as compared: torch's log lines without time and pid, the program's timing
    fields normalised; a torchrun job's lines sorted (its ranks' lines come through torchrun's
    tail, whole and marked with the rank, in an order that differs between two runs: what is
    compared is the set of lines, with repeats)."""
    text = normalise(TORCH_LOG.sub(r"\1 ", text), program.timing)
    return "\n".join(sorted(text.splitlines())) if program.ranks else text


def split_stderr(text: str) -> tuple[list[str], list[str]]:
    """(torchdoctor's lines, the program's lines). Ours: a line starting with `torchdoctor`
    and the indented lines after it (an alert's body, the summary), and the blank line the
    summary starts with."""
    ours: list[str] = []
    theirs: list[str] = []
    lines = text.splitlines()
    in_block = False
    for i, line in enumerate(lines):
        if line.startswith("torchdoctor"):
            ours.append(line)
            in_block = True
        elif (in_block and line.startswith("  ")) or lines[i + 1 : i + 2] == [
            "torchdoctor summary"
        ]:
            ours.append(line)
        else:
            in_block = False
            theirs.append(line)
    return ours, theirs


def internal_failures(stderr: str) -> list[str]:
    """torchdoctor's lines that say it failed inside. An alert (`torchdoctor ERROR [kind]`
    and its indented body) is a diagnosis: its words ("the origin could not be found") are
    what it found about the program, not a failure of its own."""
    ours, _ = split_stderr(stderr)
    found: list[str] = []
    in_alert = False
    for line in ours:
        if line.startswith("torchdoctor"):
            in_alert = bool(ALERT.match(line))
        if not in_alert and INTERNAL.search(line):
            found.append(line.strip())
    if OUR_FRAME.search(stderr):
        found += [f"traceback through torchdoctor: {m}" for m in OUR_FRAME.findall(stderr)[:3]]
    return found


def files_of(workdir_root: Path, unstable_names: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file's path (its unstable parts as <unstable>) -> the hash of its bytes."""
    out = {}
    for path in sorted(workdir_root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            name = path.relative_to(workdir_root).as_posix()
            for pattern in unstable_names:
                name = re.sub(pattern, "<unstable>", name)
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def diff_excerpt(a: str, b: str, limit: int = 12) -> str:
    lines = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "plain", "torchdoctor", n=0))
    return "\n".join(lines[2 : 2 + limit]) + ("\n..." if len(lines) > limit + 2 else "")


def query(run_dir: Path, sql: str) -> list[dict[str, Any]] | str:
    proc = subprocess.run(
        [*torchdoctor_cmd(), "query", str(run_dir), sql, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        return (proc.stderr or proc.stdout).strip()[-300:]
    try:
        rows = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return proc.stdout.strip()[-300:]
    return rows if isinstance(rows, list) else rows.get("rows", [])


def diagnoses(run_dir: Path, job: bool = False) -> list[dict[str, Any]]:
    """A run's diagnoses (its diagnoses.jsonl); a torchrun job's every rank's, each with its
    rank, as `torchdoctor diagnoses JOB_DIR` gives them (one that cannot be read counts as
    an alarm)."""
    if job:
        proc = subprocess.run(
            [*torchdoctor_cmd(), "diagnoses", str(run_dir), "--format", "json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        try:
            found = json.loads(proc.stdout) if proc.returncode == 0 else None
        except json.JSONDecodeError:
            found = None
        if not isinstance(found, list):
            said = (proc.stderr or proc.stdout).strip()[-300:]
            return [{"severity": "error", "kind": "unreadable", "summary": said}]
        return found
    path = run_dir / "diagnoses.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def fixes(d: dict[str, Any]) -> list[str]:
    """The ranked fixes (one a line in diagnoses.jsonl, a list in the tables' JSON)."""
    fix = d.get("fix") or []
    return fix.splitlines() if isinstance(fix, str) else [str(f) for f in fix]


def alarm(d: dict[str, Any]) -> str:
    fix = (fixes(d) or [""])[0]
    where = f" in {d.get('location')}" if d.get("location") else ""
    rank = f" on rank {d['rank']}" if d.get("rank") is not None else ""
    head = f"{d.get('severity')} [{d.get('kind')}] at step {d.get('step')}{rank}{where}"
    return f"{head}: {d.get('summary')} -> {fix}"


# ---------------------------------------------------------------------------- the checks


@dataclass
class ProgramResult:
    name: str
    status: str  # ran / skipped
    reason: str = ""
    rc_plain: int | None = None
    rc_doctor: int | None = None
    stdout_same: bool = False
    stderr_same: bool = False
    files_same: bool = False
    telemetry_failures: list[str] = field(default_factory=list)
    steps_recorded: int | None = None  # a torchrun job's: all its ranks'
    steps_expected: int | None = None  # a torchrun job's: each rank's
    ranks: int = 0
    steps_by_rank: list[int] = field(default_factory=list)
    optimizers: list[dict[str, Any]] = field(default_factory=list)
    optimizers_expected: int = 0
    false_alarms: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    seconds_plain: float = 0.0
    seconds_doctor: float = 0.0
    # On a GPU only, where a difference was found: a second plain run differed from the first
    # as well (kernels that add in a different order each run), so it is not torchdoctor's.
    plain_runs_differ: bool = False

    @property
    def ok(self) -> bool:
        return (
            self.status == "ran"
            and self.rc_plain == self.rc_doctor
            and ((self.stdout_same and self.files_same) or self.plain_runs_differ)
            and self.stderr_same
            and not self.telemetry_failures
            and self.steps_ok
            and len([o for o in self.optimizers if o["n"]]) >= self.optimizers_expected
            and not self.false_alarms
        )

    @property
    def steps_ok(self) -> bool:
        if self.ranks:
            return self.steps_by_rank == [self.steps_expected] * self.ranks
        return self.steps_recorded == self.steps_expected

    @property
    def steps_said(self) -> str:
        """recorded / expected; a torchrun job's per rank."""
        if self.ranks:
            each = ", ".join(f"rank {r}: {n}" for r, n in enumerate(self.steps_by_rank))
            said = f"{each or 'none'} / {self.steps_expected} each"
        else:
            said = f"{self.steps_recorded} / {self.steps_expected}"
        return said + ("" if self.steps_ok else " **NO**")


def check_program(
    program: Program, source: Path, scratch: Path, device: str = "cpu"
) -> ProgramResult:
    result = ProgramResult(program.name, "ran")
    args = program.args_on(device, program.args)
    plain = run_once(program, source, scratch / "plain", None, args)
    run_dir = scratch / "run-dir"
    doctor = run_once(program, source, scratch / "doctor", run_dir, args)
    result.rc_plain, result.rc_doctor = plain.rc, doctor.rc
    result.seconds_plain, result.seconds_doctor = plain.seconds, doctor.seconds
    if plain.timed_out or doctor.timed_out:
        result.differences.append(
            f"timed out after {program.timeout} s: plain={plain.timed_out} "
            f"torchdoctor={doctor.timed_out}"
        )
    if plain.rc != 0:
        result.differences.append(
            f"the plain run failed (exit {plain.rc}):\n{plain.stderr[-1500:]}"
        )
    a, b = comparable(plain.stdout, program), comparable(doctor.stdout, program)
    result.stdout_same = a == b
    if not result.stdout_same:
        result.differences.append("stdout:\n" + diff_excerpt(a, b))
    # Failures of torchdoctor's own are counted before its lines are left out.
    result.telemetry_failures = internal_failures(doctor.stderr)
    _, theirs = split_stderr(doctor.stderr)
    plain_err = comparable(plain.stderr, program)
    doctor_err = comparable("\n".join(theirs), program)
    result.stderr_same = plain_err.splitlines() == doctor_err.splitlines()
    if not result.stderr_same:
        result.differences.append(
            "stderr (torchdoctor's lines left out):\n" + diff_excerpt(plain_err, doctor_err)
        )
    fa = files_of(scratch / "plain" / "root", program.unstable_names)
    fb = files_of(scratch / "doctor" / "root", program.unstable_names)
    for name in program.unstable_files:  # compared by presence only
        if name in fa and name in fb:
            fa[name] = fb[name] = "present"
    result.files_same = fa == fb
    if not result.files_same:
        only_a = sorted(set(fa) - set(fb))
        only_b = sorted(set(fb) - set(fa))
        changed = sorted(k for k in set(fa) & set(fb) if fa[k] != fb[k])
        result.differences.append(
            f"files: only plain {only_a[:8]}, only torchdoctor {only_b[:8]}, differ {changed[:8]}"
        )
    if device != "cpu" and not (result.stdout_same and result.files_same):
        again = run_once(program, source, scratch / "plain-again", None, args)
        fc = files_of(scratch / "plain-again" / "root", program.unstable_names)
        result.plain_runs_differ = comparable(again.stdout, program) != a or fc != fa
        if result.plain_runs_differ:
            result.differences.append("a second plain run differs from the first as well")
    result.steps_expected = program.expected_steps(Run(plain.workdir, plain.stdout, plain.counter))
    result.ranks = program.ranks
    if program.ranks:
        steps = query(
            run_dir, "SELECT rank, count(*) AS n FROM python.steps GROUP BY rank ORDER BY rank"
        )
    else:
        steps = query(run_dir, "SELECT count(*) AS n FROM python.steps")
    if isinstance(steps, str):
        result.differences.append(f"python.steps could not be read: {steps}")
        result.steps_recorded = None
    else:
        result.steps_recorded = sum(int(row["n"]) for row in steps)
        if program.ranks:
            by_rank = {int(row["rank"]): int(row["n"]) for row in steps}
            result.steps_by_rank = [by_rank.get(r, 0) for r in range(program.ranks)]
    opt = query(
        run_dir,
        "SELECT optimizer, is_primary, count(*) AS n FROM python.optimizer_steps "
        "GROUP BY optimizer, is_primary ORDER BY optimizer",
    )
    if isinstance(opt, str):
        result.differences.append(f"python.optimizer_steps could not be read: {opt}")
    else:
        result.optimizers = opt
    result.optimizers_expected = program.optimizers
    for d in diagnoses(run_dir, job=program.ranks > 0):
        (result.false_alarms if d.get("severity") in ("warning", "error") else result.info).append(
            alarm(d)
        )
    return result


@dataclass
class BugResult:
    name: str
    program: str
    what: str
    status: str
    reason: str = ""
    expected: str = ""
    found: bool = False
    place: bool = False
    fix: bool = False
    first: bool = False  # the first warning or error `torchdoctor diagnoses` prints is the bug's
    said: list[str] = field(default_factory=list)
    judged: str = ""  # the diagnosis of an accepted kind judged: the rightest one
    telemetry_failures: list[str] = field(default_factory=list)
    rc: int | None = None
    seconds: float = 0.0


def resolve(root: Path, line: Line) -> str:
    text = (root / line.file).read_text().splitlines()
    hits = [i + 1 for i, t in enumerate(text) if line.text in t]
    number = hits[line.nth] if len(hits) > line.nth else -1
    return f"{Path(line.file).name}:{number}"


def right_place(d: dict[str, Any], modules: tuple[str, ...], lines: list[str]) -> bool:
    """The location names one of the modules (`name.*`: any module under `name`) or lines;
    a file:line may also be in the summary (a module located, the line said in words)."""
    where = f"{d.get('location') or ''}"
    said = f"{where} {d.get('summary') or ''}"
    if any(re.search(rf"(^|[/\s(]){re.escape(spot)}\b", said) for spot in lines):
        return True
    for module in modules:
        name = re.escape(module[:-2]) + r"\.[\w.]+" if module.endswith(".*") else re.escape(module)
        if re.search(rf"(^|[\s('\"`]){name}($|[\s)'\"`:,])", where):
            return True
    return any(re.search(rf"(^|[/\s(]){re.escape(spot)}\b", where) for spot in lines)


def check_bug(
    bug: Bug,
    program: Program,
    source: Path,
    scratch: Path,
    as_is: bool = False,
    device: str = "cpu",
) -> BugResult:
    """A planted bug (the program healthy, then the bug's patches), or with `as_is` one of
    the program's own bugs (the program with its ports only)."""
    result = BugResult(bug.name, bug.program, bug.what, "ran")
    run_dir = scratch / "run-dir"
    args = program.args_on(device, bug.args if bug.args is not None else program.args)
    outcome = run_once(
        program, source, scratch / "doctor", run_dir, args, bug.patches, bug.env, as_is
    )
    result.rc, result.seconds = outcome.rc, outcome.seconds
    result.telemetry_failures = internal_failures(outcome.stderr)
    root = scratch / "doctor" / "root"
    spots = [resolve(root, line) for line in bug.lines]
    result.expected = (
        f"{' or '.join(bug.kinds)} at {' / '.join([*bug.modules, *spots])}; fix ~ /{bug.fix}/"
    )
    said = [
        d
        for d in diagnoses(run_dir, job=program.ranks > 0)
        if d.get("severity") in ("warning", "error")
    ]
    result.said = [alarm(d) for d in said]
    if outcome.timed_out:
        result.said.append(f"(the run timed out after {program.timeout} s)")
    split = query(
        run_dir,
        "SELECT count(*) AS steps, sum(duration) AS d, sum(data_wait) AS data, "
        "sum(forward) AS forward, sum(backward) AS backward, sum(optimizer) AS optimizer, "
        "sum(other) AS other FROM python.steps",
    )
    if isinstance(split, list) and split and split[0].get("steps"):
        row, total = split[0], split[0]["d"] or 1e-12
        result.said.append(
            f"(python.steps: {row['steps']} steps; time: "
            + ", ".join(
                f"{k} {100 * (row[k] or 0) / total:.0f}%"
                for k in ("data", "forward", "backward", "optimizer", "other")
            )
            + ")"
        )
    hits = [d for d in said if d.get("kind") in bug.kinds]
    if hits:
        result.found = True
        placed = [right_place(d, bug.modules, spots) for d in hits]
        fixed = [bool(re.search(bug.fix, (fixes(d) or [""])[0], re.IGNORECASE)) for d in hits]
        result.place, result.fix = any(placed), any(fixed)
        # A job's ranks may each say it: the table shows the one that is most right.
        best = max(range(len(hits)), key=lambda i: (placed[i] and fixed[i], placed[i], fixed[i]))
        result.judged = alarm(hits[best])
    result.first = told_first(run_dir) in bug.kinds
    return result


# A finding's headline in `torchdoctor diagnoses`, after a job's "rank 0: " or "job: "
_HEADLINE = re.compile(r"(?m)^(?:[^\[\n]*: )?\[(?:warning|error)\] (\w+)")


def told_first(run_dir: Path) -> str | None:
    """The kind of the first warning or error `torchdoctor diagnoses RUN_DIR` prints: what a
    user reads first, in the story's order (a consequence listed before its cause sends them
    the wrong way). The JSON format lists the rows as recorded, so the text is read."""
    proc = subprocess.run(
        [*torchdoctor_cmd(), "diagnoses", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    found = _HEADLINE.search(proc.stdout) if proc.returncode == 0 else None
    return found.group(1) if found else None


@dataclass
class CheckResult:
    name: str
    program: str
    what: str
    status: str
    ok: bool = False
    said: str = ""
    reason: str = ""


def torchdoctor_cmd() -> list[str]:
    """The installed command beside this interpreter, else `python -m torchdoctor` (a
    source tree on PYTHONPATH, as on a GPU machine with no install)."""
    command = Path(sys.executable).with_name("torchdoctor")
    return [str(command)] if command.exists() else [sys.executable, "-m", "torchdoctor"]


def check_live(check: LiveCheck, program: Program, source: Path, scratch: Path) -> CheckResult:
    """Run the program under torchdoctor, ask once its stdout shows `after`, let it finish."""
    result = CheckResult(check.name, check.program, check.why, "ran")
    root = scratch / "work"
    shutil.copytree(source, root, ignore=shutil.ignore_patterns(STAMP))
    apply(root, program.healthy)
    env = environment(program, root, {}, scratch / "counter")
    argv = [
        *torchdoctor_cmd(),
        "run",
        "-q",
        "--run-dir",
        str(scratch / "run-dir"),
        program.script,
        *program.args,
    ]
    with open(scratch / "stderr.txt", "w") as err:
        proc = subprocess.Popen(
            argv,
            cwd=root / program.workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
        )
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + program.timeout
            for line in proc.stdout:
                if re.search(check.after, line):
                    asked = subprocess.run(
                        [*torchdoctor_cmd(), str(proc.pid), *check.verb],
                        capture_output=True,
                        text=True,
                        timeout=120,
                    )
                    result.said = (asked.stdout + asked.stderr).strip()
                    result.ok = asked.returncode == 0 and bool(re.search(check.expect, result.said))
                    break
                if time.monotonic() > deadline:
                    break
            else:
                result.said = "(the program ended before the line to ask after)"
            for _ in proc.stdout:  # let it finish
                pass
            proc.wait(timeout=program.timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return result


def check_overfit(
    check: OverfitCheck, program: Program, source: Path, scratch: Path
) -> CheckResult:
    result = CheckResult(check.name, check.program, check.why, "ran")
    root = scratch / "work"
    shutil.copytree(source, root, ignore=shutil.ignore_patterns(STAMP))
    apply(root, program.healthy)
    env = environment(program, root, {}, scratch / "counter")
    argv = [
        *torchdoctor_cmd(),
        "overfit",
        "--steps",
        str(check.steps),
        "--format",
        "json",
        program.script,
        *program.args,
    ]
    try:
        proc = subprocess.run(
            argv,
            cwd=root / program.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=program.timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        result.said = f"(timed out after {program.timeout} s)"
        return result
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result.said = f"exit {proc.returncode}; no JSON: {(proc.stdout + proc.stderr)[-600:]}"
        return result
    suspects = json.dumps(report.get("suspects", []))
    blamed = re.search(check.not_suspect, suspects, re.IGNORECASE)
    passed = bool(report.get("passed"))
    result.ok = not blamed and (passed or not check.passes)
    result.said = (
        f"passed={passed}, first loss {report.get('first_loss')}, final {report.get('final_loss')};"
        f" suspects: {suspects[:700]}"
    )
    return result


# ---------------------------------------------------------------------------- the scorecard


def mark(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def commit() -> str:
    """The last commit that changed torchdoctor itself (src/), and whether src/ is modified."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True
        ).stdout.strip()

    src = git("log", "-1", "--format=%h %cs", "--abbrev=12", "--", "src")
    dirty = git("status", "--porcelain", "--", "src")
    return f"{src} (last commit to src/)" + (", src/ modified" if dirty else "")


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def render(
    programs: list[ProgramResult],
    bugs: list[BugResult],
    checks: list[CheckResult],
    seconds: float,
    note: str = "",
    when: str = "",
    version: str = "",
    real: list[BugResult] | None = None,
) -> str:
    ran = [p for p in programs if p.status == "ran"]
    lines = [
        "# Accuracy on real programs",
        "",
        "Generated by `python benchmarks/realworld.py` (`make realworld`); do not edit by hand.",
        "The programs are not in the repository: `make realworld-populate` (or",
        "`python benchmarks/realworld.py --populate`) copies them, at the commits named here,",
        "from local mirrors of their repositories (/work/.mirror/<owner>+<name>/repo, made by the",
        "search tool's `fetch`) into ~/.cache/torchdoctor/realworld, with their synthetic data.",
        "Without that cache the benchmark says so and stops. `--only NAME,...` runs a part",
        "(programs, bugs or checks by name), `--json FILE` keeps the results, `--render-from",
        "FILE` rewrites this page from them.",
        f"Run {when or now()} on torchdoctor {version or commit()}, {os.cpu_count()} CPU cores, "
        f"{seconds / 60:.1f} min in all.",
        "",
        "Public training programs (benchmarks/realworld/programs.py: repository, commit, files,",
        "command line, synthetic data) are run plain and under `torchdoctor run`, healthy, then",
        "with planted bugs (benchmarks/realworld/bugs.py). How it is judged: the docstring of",
        "benchmarks/realworld.py. What is normalised: the program's own timing fields in stdout",
        "and stderr (listed per program below) and the time and pid of torch's own log lines,",
        "nothing else; both runs get PYTHONHASHSEED=0. A torchrun job (`ranks` in programs.py,",
        "run under torchdoctor as `TORCHDOCTOR=1 TORCHDOCTOR_RUN_DIR=DIR python -m",
        "torch.distributed.run --tee 3 ...`: each rank's lines whole, marked `[rankN]:`) has its",
        "stdout and stderr compared as sorted line sets (its ranks' lines come in no fixed",
        "order) and must record every step on every rank.",
        "A program with bugs of its own runs healthy with them fixed (`fixes` in programs.py);",
        "what torchdoctor says about them as they are: the section Real bugs below.",
        "",
        *([note, ""] if note else []),
        "## Healthy runs",
        "",
        f"{len([p for p in ran if p.ok])} of {len(ran)} programs pass every check; "
        f"telemetry failures: {sum(len(p.telemetry_failures) for p in ran)}; "
        f"false alarms: {sum(len(p.false_alarms) for p in ran)}.",
        "",
        "| program | stdout same | stderr same | files same | exit code plain / td | "
        "telemetry failures | steps recorded / expected | optimizers with rows | false alarms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in programs:
        if p.status != "ran":
            lines.append(f"| {p.name} | skipped: {p.reason} | | | | | | | |")
            continue
        opts = ", ".join(
            f"{o['optimizer']}{' (primary)' if o.get('primary') else ''}: {o['n']}"
            for o in p.optimizers
        )
        lines.append(
            f"| {p.name} | {mark(p.stdout_same)} | {mark(p.stderr_same)} | {mark(p.files_same)} "
            f"| {p.rc_plain} / {p.rc_doctor}{'' if p.rc_plain == p.rc_doctor else ' **NO**'} "
            f"| {len(p.telemetry_failures) or 0}{'' if not p.telemetry_failures else ' **NO**'} "
            f"| {p.steps_said} "
            f"| {opts or 'none'} (need {p.optimizers_expected}) "
            f"| {len(p.false_alarms)}{'' if not p.false_alarms else ' **NO**'} |"
        )
    lines += [
        "",
        "## Planted bugs",
        "",
        f"found {sum(b.found for b in bugs)} of {len(bugs)}, at the right place "
        f"{sum(b.place for b in bugs)}, with the right first fix {sum(b.fix for b in bugs)}, "
        f"told first {sum(b.first for b in bugs)} (the first warning or error `torchdoctor "
        "diagnoses` prints is the bug's own, not a consequence of it).",
        "",
        "| bug | program | planted | found (kind) | right place | right first fix | told first "
        "| expected |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b in bugs:
        if b.status != "ran":
            lines.append(f"| {b.name} | {b.program} | {b.what} | skipped: {b.reason} | | | | |")
            continue
        lines.append(
            f"| {b.name} | {b.program} | {b.what} | {mark(b.found)} | {mark(b.place)} "
            f"| {mark(b.fix)} | {mark(b.first)} | {b.expected.replace('|', '/')} |"
        )
    real = real or []
    lines += [
        "",
        "## Real bugs found in the public programs as they are",
        "",
        "Bugs of the programs themselves, as published at the commits named here: each program",
        "runs with its ports to this machine only (`port` in programs.py, no `fixes`), under",
        "torchdoctor; what a truthful doctor says is declared in benchmarks/realworld/bugs.py",
        "(REAL_BUGS) as for a planted bug. The healthy runs above have these bugs fixed.",
        "",
        f"found {sum(b.found for b in real)} of {len(real)}, at the right place "
        f"{sum(b.place for b in real)}, with the right first fix {sum(b.fix for b in real)}, "
        f"told first {sum(b.first for b in real)}.",
        "",
        "| bug | program | the bug | what torchdoctor said | found (kind) | right place "
        "| right first fix | told first | expected |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for b in real:
        if b.status != "ran":
            lines.append(f"| {b.name} | {b.program} | {b.what} | skipped: {b.reason} | | | | | |")
            continue
        first = b.judged or next(
            (s for s in b.said if not s.startswith("(")), "(nothing at warning or error)"
        )
        lines.append(
            f"| {b.name} | {b.program} | {b.what} | {first.replace('|', '/')} | {mark(b.found)} "
            f"| {mark(b.place)} | {mark(b.fix)} | {mark(b.first)} "
            f"| {b.expected.replace('|', '/')} |"
        )
    lines += [
        "",
        "## Live verbs and recipes",
        "",
        "`torchdoctor PID eval|backtrace` asked while the program runs under torchdoctor, and",
        "`torchdoctor overfit` on the program (benchmarks/realworld/live.py).",
        "",
        "| check | program | right | what must hold | what it said |",
        "|---|---|---|---|---|",
    ]
    for c in checks:
        said = " ".join(c.said.split())[:300].replace("|", "/")
        lines.append(
            f"| {c.name} | {c.program} | "
            f"{mark(c.ok) if c.status == 'ran' else 'skipped: ' + c.reason} | {c.what} | {said} |"
        )
    lines += ["", "## Details", ""]
    for p in programs:
        lines.append(f"### {p.name}")
        lines.append("")
        program = by_name(p.name)
        about = (
            f"{program.repo}@{program.commit[:12]} `{program.script} {' '.join(program.args)}`"
            f" (cwd {program.workdir}); data: {program.data_note or 'none'}"
        )
        if program.ranks:
            about += (
                f"; a torchrun job of {program.ranks} ranks (gloo, CPU), stdout and stderr "
                "compared as sorted line sets"
            )
        if program.port:
            about += f"; adapted: {len(program.port)} patch(es), `port` in programs.py"
        if program.fixes:
            about += (
                f"; its own bug fixed: {len(program.fixes)} patch(es), `fixes` in programs.py "
                "(section Real bugs: the program as it is)"
            )
        if program.unstable_names:
            names = "`, `".join(program.unstable_names)
            about += f"; parts of file names compared as <unstable>: `{names}`"
        if program.unstable_files:
            about += f"; compared by presence only: {', '.join(program.unstable_files)}"
        if program.timing:
            about += f"; timing fields normalised: `{'`, `'.join(program.timing)}`"
        lines += [about, ""]
        if p.status != "ran":
            lines += [f"skipped: {p.reason}", ""]
            continue
        lines.append(f"plain {p.seconds_plain:.1f} s, under torchdoctor {p.seconds_doctor:.1f} s.")
        lines.append("")
        for title, items in (
            ("telemetry failures", p.telemetry_failures),
            ("false alarms", p.false_alarms),
            ("info diagnoses", p.info),
            ("differences", p.differences),
        ):
            if items:
                lines.append(f"{title}:")
                lines.append("")
                lines.append("```")
                lines += [s for item in items for s in item.splitlines()]
                lines.append("```")
                lines.append("")
    for b, title in [*((b, "bug") for b in bugs), *((b, "real bug") for b in real)]:
        if b.status != "ran":
            continue
        lines.append(f"### {title} {b.name}")
        lines.append("")
        lines.append(f"{b.what}; exit code {b.rc}; {b.seconds:.1f} s; expected {b.expected}.")
        lines.append("")
        lines.append("```")
        lines += b.said or ["(no diagnosis at warning or error)"]
        lines += [f"TELEMETRY FAILURE: {t}" for t in b.telemetry_failures]
        lines.append("```")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _usable(cache: Path, program: Program) -> tuple[Path | None, str]:
    """(the program's cached source, "") or (None, why it cannot run here)."""
    source = cached(cache, program)
    if source is None:
        return None, "program not in the cache"
    missing = [m for m in program.needs if not importable(m)]
    if missing:
        return None, f"needs {', '.join(missing)}"
    return source, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--populate", action="store_true", help="mirrors -> cache, then stop")
    parser.add_argument("--mirror", type=Path, default=MIRROR)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--only", default="", help="comma-separated program or bug names")
    parser.add_argument("--no-bugs", action="store_true")
    parser.add_argument("--bugs-only", action="store_true")
    parser.add_argument("--no-live", action="store_true", help="no live-verb or recipe checks")
    parser.add_argument(
        "--out",
        type=Path,
        help=f"the scorecard (default {DOC.relative_to(ROOT)} "
        "for a full run; a partial run only prints)",
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the runs' copies (printed)")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the programs that can use a GPU, on it (the others are left out); "
        "a difference from plain is checked against a second plain run",
    )
    parser.add_argument(
        "--render-from", type=Path, help="rewrite the scorecard from a --json file, run nothing"
    )
    args = parser.parse_args(argv)

    if args.render_from is not None:
        saved = json.loads(args.render_from.read_text())
        loaded = (
            [ProgramResult(**p) for p in saved["programs"]],
            [BugResult(**b) for b in saved["bugs"]],
            [CheckResult(**c) for c in saved.get("checks", [])],
        )
        total = saved.get("seconds") or sum(
            p.seconds_plain + p.seconds_doctor for p in loaded[0]
        ) + sum(b.seconds for b in loaded[1])
        text = render(
            *loaded,
            total,
            saved.get("note", ""),
            saved.get("when", ""),
            saved.get("version", ""),
            [BugResult(**b) for b in saved.get("real_bugs", [])],
        )
        (args.out or DOC).write_text(text)
        print(f"scorecard written to {args.out or DOC}")
        return 0

    only = {n for n in args.only.split(",") if n}
    names = [p.name for p in PROGRAMS]
    if args.populate:
        return populate(args.mirror, args.cache, [n for n in names if not only or n in only])

    if not any(cached(args.cache, p) for p in PROGRAMS):
        print(
            f"realworld: skipped: no program in the cache {args.cache}. Populate it with\n"
            f"  {Path(sys.executable).name} benchmarks/realworld.py --populate\n"
            f"which reads the repositories ({', '.join(sorted({p.repo for p in PROGRAMS}))})\n"
            f"from local mirrors under {args.mirror} (fetch them with the search tool's fetch)."
        )
        return 0

    start = time.perf_counter()
    scratch_root = Path(tempfile.mkdtemp(prefix="realworld-"))
    programs: list[ProgramResult] = []
    bugs: list[BugResult] = []
    selected = [
        p
        for p in PROGRAMS
        if (not only or p.name in only) and (args.device == "cpu" or p.gpu is not None)
    ]
    on_device = {p.name for p in PROGRAMS if args.device == "cpu" or p.gpu is not None}
    if not args.bugs_only:
        for program in selected:
            source = cached(args.cache, program)
            missing = [m for m in program.needs if not importable(m)]
            if source is None or missing:
                reason = (
                    "not in the cache (run --populate)"
                    if source is None
                    else f"needs {', '.join(missing)} (pip install -e '.[dev]')"
                )
                programs.append(ProgramResult(program.name, "skipped", reason))
                print(f"{program.name}: skipped: {reason}", flush=True)
                continue
            result = check_program(program, source, scratch_root / program.name, args.device)
            programs.append(result)
            print(
                f"{program.name}: {'ok' if result.ok else 'FAIL'} "
                f"({result.seconds_plain:.0f} s plain, {result.seconds_doctor:.0f} s torchdoctor)",
                flush=True,
            )
    if not args.no_bugs:
        for bug in BUGS:
            if only and bug.name not in only and bug.program not in only:
                continue
            if bug.program not in on_device:
                continue
            program = by_name(bug.program)
            source, why_not = _usable(args.cache, program)
            if source is None:
                bugs.append(BugResult(bug.name, bug.program, bug.what, "skipped", why_not))
                continue
            r = check_bug(
                bug, program, source, scratch_root / f"bug-{bug.name}", device=args.device
            )
            bugs.append(r)
            print(
                f"bug {bug.name}: found={r.found} place={r.place} fix={r.fix} first={r.first} "
                f"({r.seconds:.0f} s)",
                flush=True,
            )
    real: list[BugResult] = []
    if not args.no_bugs:
        for bug in REAL_BUGS:
            if only and bug.name not in only and bug.program not in only:
                continue
            if bug.program not in on_device:
                continue
            program = by_name(bug.program)
            source, why_not = _usable(args.cache, program)
            if source is None:
                real.append(BugResult(bug.name, bug.program, bug.what, "skipped", why_not))
                continue
            r = check_bug(
                bug,
                program,
                source,
                scratch_root / f"real-{bug.name}",
                as_is=True,
                device=args.device,
            )
            real.append(r)
            print(
                f"real bug {bug.name}: found={r.found} place={r.place} fix={r.fix} "
                f"({r.seconds:.0f} s)",
                flush=True,
            )
    checks: list[CheckResult] = []
    if args.device == "cpu" and not args.no_live and not args.bugs_only and not args.no_bugs:
        all_checks: tuple[LiveCheck | OverfitCheck, ...] = (*LIVE, *OVERFIT)
        for check in all_checks:
            if only and check.name not in only and check.program not in only:
                continue
            program = by_name(check.program)
            source, why_not = _usable(args.cache, program)
            if source is None:
                checks.append(
                    CheckResult(check.name, check.program, check.why, "skipped", reason=why_not)
                )
                continue
            where = scratch_root / f"check-{check.name}"
            where.mkdir(parents=True)
            c = (
                check_live(check, program, source, where)
                if isinstance(check, LiveCheck)
                else check_overfit(check, program, source, where)
            )
            checks.append(c)
            print(f"check {check.name}: {'ok' if c.ok else 'WRONG'}", flush=True)
    seconds = time.perf_counter() - start
    text = render(programs, bugs, checks, seconds, real=real)
    full = (
        args.device == "cpu"
        and not only
        and not args.no_bugs
        and not args.bugs_only
        and not args.no_live
    )
    out = args.out or (DOC if full else None)
    if out is not None:
        out.write_text(text)
        print(f"scorecard written to {out}")
    else:
        print(text)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "programs": [asdict(p) for p in programs],
                    "bugs": [asdict(b) for b in bugs],
                    "real_bugs": [asdict(b) for b in real],
                    "checks": [asdict(c) for c in checks],
                    "seconds": seconds,
                    "when": now(),
                    "version": commit(),
                },
                indent=1,
                default=str,
            )
        )
    if args.keep:
        print(f"runs kept in {scratch_root}")
    else:
        shutil.rmtree(scratch_root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
