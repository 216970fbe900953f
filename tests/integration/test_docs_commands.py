"""The README and docs/*.md as tests: every shell command of theirs that runs torchdoctor
(tests/doc_commands.py finds them) is run here as written, and what the text says of its output
is checked. A command added to the docs without a line in CASES fails
test_every_doc_command_has_a_case; a doc example that stops working fails its own test.

What they run against is a training script written the way people write them
(tests/scripts/docs_train.py, copied in as `train.py`: its model, optimizer and loaders are
locals of main()), and for the live commands of the README also one with its objects at module
level (tests/scripts/trainer.py). Placeholders are filled: PID with the live process of that
script, `torchdoctor-runs/<run>` and RUN_DIR with the run the README's own `torchdoctor run
train.py --lr 3e-4` recorded, DIR and FROM:TO with a directory and a step range. Commands that
run a training script run as subprocesses, from a shell where a pipe or an assignment is part
of the command; the others run in this process through the CLI's main(), in the same working
directory and environment (they only read a run or talk to an endpoint). Commands that need
several ranks, a GPU or an external service are skipped with the reason, or name the test that
runs them verbatim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from doc_commands import ROOT, DocCommand, doc_commands
from helpers import SCRIPTS, Run, clean_env, internal_errors

pytestmark = pytest.mark.xdist_group("docs_commands")  # one worker: the runs below are shared

COMMANDS = doc_commands()
TRAINING_VERBS = {"run", "overfit", "repro", "demo", "batch-size", "attach"}
CLUSTER = (
    "a job of several ranks (torchrun, the cluster verbs, a job directory): "
    "tests/integration/test_cluster.py, test_ranks.py and test_job_dirs.py run these verbs "
    "against real jobs"
)
SHARDED = (
    "an FSDP2 job of several ranks: tests/integration/test_sharded.py runs dist_sharded.py under "
    "torchrun and checks each rank's census, its memory text and the job's steps"
)
CRASH_LOG = """\
Traceback (most recent call last):
  File "/home/me/project/train.py", line 100, in <module>
    main()
  File "/home/me/project/train.py", line 89, in main
    train_loss = train(model, train_loader, optimizer, args)
  File "/home/me/project/train.py", line 44, in train
    loss = F.cross_entropy(model(x), y)
  File "/home/me/project/.venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", \
line 134, in forward
    return F.linear(input, self.weight, self.bias)
RuntimeError: mat1 and mat2 shapes cannot be multiplied (32x20 and 16x128)
"""
MODEL_PY = '''\
"""The model as the code builds it today: the network of train.py inside a wrapper, so its
parameters are `net.encoder.0.weight` where ckpt.pt has `encoder.0.weight`."""

from torch import nn
from train import Net


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def forward(self, x):
        return self.net(x)


def build() -> nn.Module:
    return Classifier()
'''


@dataclasses.dataclass
class Result:
    command: str  # as run, placeholders filled
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return (
            f"$ {self.command}\n(exit {self.code})\n--- stdout\n{self.out}\n--- stderr\n{self.err}"
        )


@dataclasses.dataclass
class Case:
    """How a doc command is run and what its output must show."""

    needs: tuple[str, ...] = ()  # "live", "finished", "oom": the runs it is run against
    out: tuple[str, ...] = ()  # regular expressions stdout must match (re.search)
    err: tuple[str, ...] = ()  # ... and stderr
    code: int = 0
    check: Callable[[Result, Place], None] | None = None  # more, in Python
    skip: str | None = None  # why it is not run here
    covered_by: str | None = None  # the test that runs it verbatim (tests/...py::test_name)
    live_scripts: tuple[str, ...] = ("main",)  # live commands: against these scripts
    fill: dict[str, str] = dataclasses.field(default_factory=dict)  # placeholders of its own


@dataclasses.dataclass
class Place:
    """Where the doc commands run: a working directory holding train.py and what the docs
    name (model.py, mypkg/, src/, crash.log, tests/ of the repository), its environment, and
    the runs made there."""

    cwd: Path
    env: dict[str, str]
    live: dict[str, Run] = dataclasses.field(default_factory=dict)  # "main"/"module" -> run
    # the runs each test of this session still to run needs (its node id -> Case.needs): once
    # none needs the live runs, they are ended (they would train on until the module ends)
    pending: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    plain: Result | None = None  # `python train.py --lr 3e-4`, for comparison
    run_dir: str | None = None  # the finished run's directory, relative to cwd
    results: dict[str, Result] = dataclasses.field(default_factory=dict)  # doc commands run


# -- checks ------------------------------------------------------------------------------------
def _json(result: Result) -> Any:
    return json.loads(result.out)


def _run_as_python(result: Result, place: Place) -> None:
    """`torchdoctor run train.py --lr 3e-4`: exactly as `python train.py --lr 3e-4`."""
    assert place.plain is not None
    assert result.out == place.plain.out and result.code == place.plain.code == 0
    assert place.plain.err == ""
    assert not internal_errors(result.err), result.err
    assert re.search(r"^torchdoctor summary\n  24 steps in ", result.err, re.M), result.err
    # evaluate()'s passes between epochs are their own band, not the next step's forward
    assert re.search(
        r"^  time: data \d+%, forward \d+%, evaluation \d+%, backward ", result.err, re.M
    )


def _list(result: Result, place: Place) -> None:
    """Every probed process: the script and its arguments, where, its state."""
    lines = result.out.splitlines()
    assert lines[0].split() == ["pid", "state", "started", "directory", "command"], lines
    for run in place.live.values():
        row = next(line for line in lines if line.startswith(str(run.pid)))
        assert re.search(r"  step \d+  ", row) and "  .  " in row, row
    main = place.live["main"]
    assert any(
        line.startswith(str(main.pid)) and line.endswith("train.py --epochs 0 --pause 0.01")
        for line in lines
    ), lines


def _eval_lr(result: Result, place: Place) -> None:
    """The optimizer's learning rate, read between two steps: trainer.py's SGD(lr=0.05), a
    global of its __main__."""
    assert result.out == "0.05\n", result
    assert re.fullmatch(r"# ran at the step boundary after step \d+\n", result.err), result


def _eval_lr_of_main(result: Result, place: Place) -> None:
    """train.py's AdamW(lr=1e-3), halved every two epochs by its StepLR: a local of main(),
    handed to train(), whose frame answers."""
    assert 0 < float(result.out) <= 1e-3, result
    assert re.search(r"^# ran at the step boundary after step \d+$", result.err, re.M), result
    line = _line_of(place.cwd / "train.py", "optimizer.step()")
    assert f"# optimizer: from train() at train.py:{line}\n" in result.err, result


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _backtrace(result: Result, place: Place) -> None:
    assert "MainThread (main)" in result.out
    assert re.search(r"^  (train|main|<module>) \(.*train(er)?\.py:\d+\)$", result.out, re.M)


def _nothing_but_the_pause(result: Result, place: Place) -> None:
    # The live scripts sleep `--pause` seconds a step to stay alive for the commands: most of
    # each step. Before the doctor has sampled that time there is nothing to say; once it has,
    # the one true finding is that time, named at the sleep (an info). Anything else is wrong.
    out = result.out.strip()
    if out == "no problems found":
        return
    heads = [line for line in out.splitlines() if line.startswith("[")]
    assert heads and all(h.startswith("[info] unattributed_time ") for h in heads), result
    assert "`time.sleep(args.pause)`" in out, result


def _query_steps(result: Result, place: Place) -> None:
    lines = result.out.splitlines()
    assert lines[0].split() == ["step", "duration", "data_wait", "loss", "grad_norm"]
    assert lines[-1] == "(5 rows)"


def _report(result: Result, place: Place) -> None:
    page = place.cwd / "report.html"
    assert page.read_text().startswith("<!DOCTYPE html>") and page.stat().st_size < 5 * 2**20


def _baseline_report(result: Result, place: Place) -> None:
    page = (place.cwd / "b.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and '"baseline"' in page


SAME_RUN = {"RUN_A": "{run_dir}", "RUN_B": "{run_dir}"}


def _perfetto(result: Result, place: Place) -> None:
    events = json.loads((place.cwd / "trace.json").read_text())["traceEvents"]
    assert any(e.get("name") == "forward" for e in events)


def _parquet(into: str) -> Callable[[Result, Place], None]:
    def check(result: Result, place: Place) -> None:
        import pyarrow.parquet as pq

        steps = pq.read_table(place.cwd / into / "steps.parquet")
        assert steps.num_rows == 24 and "loss" in steps.column_names

    return check


def _shapes_json(result: Result, place: Place) -> None:
    shapes = _json(result)
    assert shapes["step"] == 0
    first = next(c for c in shapes["calls"] if c["module"] == "encoder.0")
    assert first["type"] == "Linear" and first["input_shapes"] == "[32, 16]", first


def _overfit_json(result: Result, place: Place) -> None:
    verdict = _json(result)
    assert verdict["passed"] is True and verdict["steps"] == 200, verdict


def _repro_json(result: Result, place: Place) -> None:
    verdict = _json(result)
    assert verdict["identical"] is True and verdict["steps"] == [5, 5], verdict


def _ckpt_fixed(result: Result, place: Place) -> None:
    import torch

    fixed = torch.load(place.cwd / "fixed.pt", weights_only=True)
    assert sorted(fixed)[0] == "net.encoder.0.bias"


def _oom_once(result: Result, place: Place) -> None:
    """The out-of-memory explained once, after the traceback, with its measured fix; the
    summary names it."""
    err = result.err
    assert err.count("Out of memory (cpu) in the forward of encoder.1") == 1, err
    assert err.index("Traceback") < err.index("torchdoctor ERROR [oom] at step 2 in encoder.1")
    assert "    ERROR [oom] at step 2 in encoder.1 (above)" in err
    assert "torchdoctor: torchdoctor" not in err


def _metrics(result: Result, place: Place) -> None:
    assert not internal_errors(result.err), result.err  # "no /metrics" would be one


def _pipe_explain(result: Result, place: Place) -> None:
    # train.py trains and ends well: its output holds no error that explain knows
    assert result.out.startswith("Error not recognised\n"), result


# -- the doc commands and what each must show ---------------------------------------------------
CASES: dict[str, Case] = {
    # README.md
    "make demo": Case(
        covered_by="tests/integration/test_diagnoses.py::test_demo_lists_and_runs",
    ),
    "torchdoctor run train.py --lr 3e-4": Case(needs=("finished",), check=_run_as_python),
    "torchdoctor list": Case(needs=("live",), check=_list, live_scripts=("main", "module")),
    "torchdoctor PID backtrace": Case(
        needs=("live",), check=_backtrace, live_scripts=("main", "module")
    ),
    'torchdoctor PID query "SELECT step, duration, data_wait, loss, grad_norm FROM '
    'python.steps ORDER BY step DESC LIMIT 5"': Case(
        needs=("live",), check=_query_steps, live_scripts=("main", "module")
    ),
    "torchdoctor PID diagnoses": Case(
        needs=("live",), check=_nothing_but_the_pause, live_scripts=("main", "module")
    ),
    'torchdoctor query torchdoctor-runs/<run> "SELECT module, stage, sum(duration) FROM '
    'python.torch_trace GROUP BY ALL ORDER BY 3 DESC LIMIT 10"': Case(
        needs=("finished",), out=(r"^module +stage +", r"\nencoder +forward ", r"backward")
    ),
    "torchdoctor diagnoses torchdoctor-runs/<run>": Case(
        needs=("finished",), out=(r"^no problems found$",)
    ),
    "TORCHDOCTOR=1 torchrun --nproc_per_node=4 train.py": Case(skip=CLUSTER),
    "torchdoctor cluster list": Case(skip=CLUSTER),
    # docs/distributed.md's FSDP2 example: a job of 2 ranks, its census and the job's norm
    "TORCHDOCTOR=1 TORCHDOCTOR_RUN_DIR=job torchrun --nproc_per_node=2 dist_sharded.py "
    "--steps 4000": Case(skip=SHARDED),
    "torchdoctor 20867 memory": Case(skip=SHARDED),
    'torchdoctor query job "SELECT step, sqrt(sum(grad_norm * grad_norm)) AS job_norm FROM '
    'python.steps GROUP BY step ORDER BY step LIMIT 3"': Case(skip=SHARDED),
    "torchdoctor PID cluster backtrace": Case(skip=CLUSTER),
    'torchdoctor PID cluster query "SELECT rank, max(step) FROM python.steps GROUP BY rank"': Case(
        skip=CLUSTER
    ),
    "torchdoctor PID cluster diagnoses": Case(skip=CLUSTER),
    "torchdoctor diagnoses torchdoctor-runs/<job>": Case(skip=CLUSTER),
    "torchdoctor report torchdoctor-runs/<run> -o report.html": Case(
        needs=("finished",), check=_report
    ),
    "torchdoctor export torchdoctor-runs/<run> --perfetto trace.json": Case(
        needs=("finished",), check=_perfetto
    ),
    "torchdoctor export torchdoctor-runs/<run> --parquet tables/": Case(
        needs=("finished",), check=_parquet("tables")
    ),
    # docs/diagnoses.md
    "torchdoctor diagnoses RUN_DIR": Case(needs=("finished",), out=(r"^no problems found$",)),
    'torchdoctor PID query "SELECT kind, location, summary FROM python.diagnoses"': Case(
        needs=("live",), out=(r"^kind +location +summary\n", r"\(0 rows\)$")
    ),
    # docs/distributed.md
    'torchdoctor cluster query "SELECT step, sqrt(sum(grad_norm * grad_norm)) AS job_norm '
    'FROM python.steps GROUP BY step ORDER BY step"': Case(skip=CLUSTER),
    'torchdoctor query JOB_DIR "SELECT step, sqrt(sum(grad_norm * grad_norm)) FROM '
    'python.steps GROUP BY step"': Case(skip=CLUSTER),
    "torchdoctor [ENDPOINT] cluster list": Case(skip=CLUSTER),
    "torchdoctor [ENDPOINT] cluster backtrace": Case(skip=CLUSTER),
    'torchdoctor [ENDPOINT] cluster query "SQL"': Case(skip=CLUSTER),
    "torchdoctor [ENDPOINT] cluster diagnoses": Case(skip=CLUSTER),
    "torchdoctor cluster backtrace": Case(skip=CLUSTER),
    # docs/explain.md
    "torchdoctor explain crash.log": Case(
        out=(r"^shape\.matmul: ", r"32x20 and 16x128", r"\nFixes\n")
    ),
    "python train.py 2>&1 | torchdoctor explain": Case(check=_pipe_explain),
    "torchdoctor explain crash.log --format json": Case(out=(r'"category": "shape\.matmul"',)),
    "torchdoctor explain crash.log --here": Case(out=(r"^shape\.matmul: ", r"32x20 and 16x128")),
    "torchdoctor explain RUN_DIR": Case(  # a run that recorded an error: memory.md's
        needs=("oom",),
        fill={"RUN_DIR": "oom-run"},
        out=(r"^oom\.cpu: Host \(CPU\) out of memory\n", r"Tried to allocate 4\.00 TiB"),
    ),
    "torchdoctor explain --list": Case(out=(r"shape\.matmul", r"oom\.cuda")),
    "torchdoctor explain logs/": Case(skip=CLUSTER),
    "TORCHDOCTOR=1 TORCHDOCTOR_RUN_DIR=runs/job torchrun --nproc_per_node=8 train.py": Case(
        skip=CLUSTER
    ),
    "torchdoctor diagnoses runs/job": Case(skip=CLUSTER),
    "torchdoctor cluster diagnoses": Case(skip=CLUSTER),
    # docs/integrations.md
    "torchdoctor run --metrics 127.0.0.1:9400 train.py": Case(check=_metrics),
    "TORCHDOCTOR=1 TORCHDOCTOR_METRICS=0.0.0.0:9400 TORCHDOCTOR_TOKEN=$(cat ~/.td-token) "
    "torchrun --nproc-per-node 4 train.py": Case(skip=CLUSTER),
    # docs/lint.md
    "torchdoctor lint train.py src/": Case(out=(r"^No problems found \(2 files checked\)\.$",)),
    "torchdoctor lint src --select TD1,TD401": Case(out=(r"No problems found",)),
    "torchdoctor lint src --ignore TD502": Case(out=(r"No problems found",)),
    "torchdoctor lint src --format json": Case(out=(r"^\[\]$",)),
    "torchdoctor lint --list-rules": Case(out=(r"TD402 ", r"TD101 ")),
    "torchdoctor lint --rule TD402": Case(out=(r"^TD402 clip-without-unscale", r"What it finds")),
    # docs/memory.md
    "torchdoctor run --run-dir oom-run tests/scripts/oom_train.py --where forward": Case(
        needs=("oom",), code=1, check=_oom_once
    ),
    "torchdoctor memory oom-run": Case(
        needs=("oom",),
        out=(
            r"^Out of memory \(cpu\) at step 2, in the forward of encoder\.1 \(Blowup\)\n",
            r"\n  asked for    4\.00 TiB\n",
            r"\nheld when it failed \(cpu\)\n",
            r"\nfixes, the biggest estimated saving first",
        ),
    ),
    "torchdoctor batch-size --start 32 --limit-memory 300MiB -- python "
    "tests/scripts/memory_train.py --optimizer manual --steps 2 --stop-file '' "
    "--batch-size {}": Case(
        covered_by="tests/integration/test_memory.py::"
        "test_batch_size_cli_answer_runs_and_the_next_size_does_not"
    ),
    # docs/recipes.md
    "torchdoctor overfit train.py --lr 3e-4": Case(
        out=(r"^overfit PASSED: the model memorised its first batch in 200 steps$",)
    ),
    "torchdoctor overfit --steps 100 -m mypkg.train": Case(
        out=(r"^overfit PASSED: the model memorised its first batch in 100 steps$",)
    ),
    "torchdoctor overfit --format json train.py": Case(check=_overfit_json),
    "torchdoctor repro train.py ARGS...": Case(
        out=(r"^repro PASSED: the two runs are bit-identical over 20 steps$",)
    ),
    "torchdoctor repro --steps 5 --format json train.py": Case(check=_repro_json),
    "torchdoctor PID shapes": Case(
        needs=("live",),
        out=(
            r"^  encoder \(Sequential\) +\[32, 16\] +\[32, 128\] ",
            r"^    0 \(Linear\) +\[32, 16\] +\[32, 128\] +float32 +cpu +2,176$",
            r"^  head \(Linear\) +\[32, 128\] +\[32, 4\] ",
        ),
    ),
    "torchdoctor shapes torchdoctor-runs/<run> --step 0 --format json": Case(
        needs=("finished",), check=_shapes_json
    ),
    "torchdoctor ckpt ckpt.pt": Case(
        needs=("finished",), out=(r"^ckpt\.pt: torch\.save \(zip format\)", r"6 tensors")
    ),
    "torchdoctor ckpt ckpt.pt --model model.py:build": Case(
        needs=("finished",),
        code=1,
        out=(r"loads with strict=True: NO", r"add the prefix 'net\.'", r"--fix OUT\.pt"),
    ),
    "torchdoctor ckpt ckpt.pt --model model.py:build --fix fixed.pt": Case(
        needs=("finished",), out=(r"Fix written to fixed\.pt",), check=_ckpt_fixed
    ),
    "torchdoctor ckpt ckpt.pt --format json": Case(needs=("finished",), out=(r'"tensors": 6',)),
    'torchdoctor query RUN_DIR "SELECT kind, function, location, reason, count FROM '
    'python.compile"': Case(needs=("finished",), out=(r"^kind +function +location +reason",)),
    'torchdoctor query RUN_DIR "SELECT location, reason, count(*) FROM python.compile\n'
    "                           WHERE kind = 'graph_break' GROUP BY ALL ORDER BY 3 DESC\"": Case(
        needs=("finished",), out=(r"^location +reason +count_star\(\)",)
    ),
    'torchdoctor query RUN_DIR "SELECT step, function, reason FROM python.compile\n'
    "                           WHERE kind IN ('recompile', 'recompile_limit') ORDER BY "
    'time"': Case(needs=("finished",), out=(r"^step +function +reason",)),
    # docs/report.md
    "torchdoctor report RUN_DIR|JOB_DIR -o report.html": Case(needs=("finished",), check=_report),
    "torchdoctor PID report -o report.html": Case(needs=("live",), check=_report),
    "torchdoctor report RUN_DIR --format json": Case(
        needs=("finished",), out=(r'^\{\n +"version": 1,', r'"training"')
    ),
    "torchdoctor export RUN_DIR|JOB_DIR --perfetto trace.json [--steps FROM:TO]": Case(
        needs=("finished",), check=_perfetto
    ),
    "torchdoctor export RUN_DIR|JOB_DIR --parquet DIR": Case(
        needs=("finished",), check=_parquet("parquet-dir")
    ),
    # docs/recipes.md: compare (the finished run against itself, and the live one against it;
    # tests/integration/test_compare.py plants the differences)
    "torchdoctor compare RUN_A RUN_B": Case(
        needs=("finished",), fill=SAME_RUN, out=(r"^No real difference",)
    ),
    "torchdoctor compare RUN_A RUN_B --format json": Case(
        needs=("finished",), fill=SAME_RUN, out=(r'^\{\n +"version": 1,', r'"headline"')
    ),
    "torchdoctor PID compare RUN_A": Case(
        needs=("live", "finished"), fill=SAME_RUN, out=(r"^A: ", r"^B: ")
    ),
    "torchdoctor compare BASE NIGHTLY --noise-floor 5% --fail-if "
    "slower:5%,loss:2%,memory:10%": Case(
        needs=("finished",), fill={"BASE": "{run_dir}", "NIGHTLY": "{run_dir}"}
    ),
    "torchdoctor report RUN_B -o b.html --baseline RUN_A": Case(
        needs=("finished",), fill=SAME_RUN, check=_baseline_report
    ),
}
# The README's eval, on both scripts: from main()'s locals, and from module-level globals.
CASES["torchdoctor PID eval \"optimizer.param_groups[0]['lr']\""] = Case(
    needs=("live",), check=_eval_lr_of_main, live_scripts=("main", "module")
)
EVAL_MODULE_LEVEL = Case(needs=("live",), check=_eval_lr)

# Placeholders of the docs, as whole arguments.
FILLED = {
    "torchdoctor-runs/<run>": "{run_dir}",
    "RUN_DIR": "{run_dir}",
    "RUN_DIR|JOB_DIR": "{run_dir}",
    "PID": "{pid}",
    "DIR": "parquet-dir",
    "ARGS...": None,  # none
}


# -- the place and its runs --------------------------------------------------------------------
@pytest.fixture(scope="module")
def place(request: pytest.FixtureRequest) -> Iterator[Place]:
    root = Path(tempfile.mkdtemp(prefix="td-docs-"))
    cwd = root / "project"
    cwd.mkdir()
    shutil.copy(SCRIPTS / "docs_train.py", cwd / "train.py")
    (cwd / "src").mkdir()
    shutil.copy(SCRIPTS / "docs_train.py", cwd / "src" / "train.py")
    (cwd / "mypkg").mkdir()
    (cwd / "mypkg" / "__init__.py").write_text("")
    shutil.copy(SCRIPTS / "docs_train.py", cwd / "mypkg" / "train.py")
    (cwd / "model.py").write_text(MODEL_PY)
    (cwd / "crash.log").write_text(CRASH_LOG)
    (cwd / "tests").symlink_to(ROOT / "tests")  # the docs name tests/scripts/... from the root
    env = clean_env(root / "s")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    place = Place(cwd, env)
    for item in request.session.items:
        command = getattr(item, "callspec", None) and item.callspec.params.get("command")
        if item.module is request.module and command and command.text in CASES:
            place.pending[item.nodeid] = CASES[command.text].needs
    try:
        yield place
    finally:
        _end_live(place)
        shutil.rmtree(root, ignore_errors=True)


def _end_live(place: Place) -> None:
    for run in place.live.values():
        run.kill()
        run.wait()  # closes its output files
    place.live.clear()


def _shell(command: str, place: Place, timeout: float = 300) -> Result:
    out = subprocess.run(
        ["bash", "-c", command],
        cwd=place.cwd,
        env=place.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(command, out.returncode, out.stdout, out.stderr)


README_RUN = "torchdoctor run train.py --lr 3e-4"
OOM_RUN = "torchdoctor run --run-dir oom-run tests/scripts/oom_train.py --where forward"


def _finished(place: Place) -> None:
    """The README's `torchdoctor run train.py --lr 3e-4` (and the plain run it is compared
    with): the run directory the saved-run commands read, ckpt.pt for the ckpt commands."""
    if README_RUN in place.results:
        return
    finished = place.results[README_RUN] = _shell(README_RUN, place)
    assert finished.code == 0, finished
    (plain_dir := place.cwd / "plain").mkdir()
    out = subprocess.run(
        [sys.executable, "../train.py", "--lr", "3e-4"],
        cwd=plain_dir,
        env=place.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    place.plain = Result("python train.py --lr 3e-4", out.returncode, out.stdout, out.stderr)
    (run_dir,) = (place.cwd / "torchdoctor-runs").iterdir()
    place.run_dir = str(run_dir.relative_to(place.cwd))


def _live(place: Place) -> None:
    if place.live:
        return
    # The finished run first where a test needs it: run while the live scripts train, it would
    # keep them training the longer (the tests on the live runs run first: see LIVE_FIRST).
    if any("finished" in needs for needs in place.pending.values()):
        _finished(place)
    shutil.copy(SCRIPTS / "trainer.py", place.cwd / "trainer.py")
    tools = Path(sys.executable).parent
    argv = {
        "main": [str(tools / "torchdoctor"), "run", "train.py", "--epochs", "0", "--pause", "0.01"],
        "module": [str(tools / "torchdoctor"), "run", "trainer.py", "--pause", "0.01"],
    }
    for name, command in argv.items():  # started together: they import torch side by side
        place.live[name] = Run(command, place.env, place.cwd)
    for run in place.live.values():
        run.wait_probe(120)
        run.wait_steps(3, 120)


def _oom(place: Place) -> None:
    """memory.md's run that dies of an out-of-memory, for `torchdoctor memory oom-run`."""
    if OOM_RUN not in place.results:
        place.results[OOM_RUN] = _shell(OOM_RUN, place)


def _prepare(case: Case, place: Place) -> None:
    for need in case.needs:
        {"finished": _finished, "live": _live, "oom": _oom}[need](place)


def _fill(words: list[str], place: Place, pid: int | None, own: dict[str, str]) -> list[str]:
    out = []
    for word in words:
        filled = own.get(word, FILLED.get(word, word))
        if filled is None:
            continue
        out.append(filled.format(run_dir=place.run_dir, pid=pid))
    return out


def _in_process(argv: list[str], place: Place) -> Result:
    """The CLI's main() here, as the console script would run it in `place`."""
    from torchdoctor.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    os.environ.clear()
    os.environ.update(place.env)
    os.chdir(place.cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv[1:])
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return Result(shlex.join(argv), code, out.getvalue(), err.getvalue())


SHELL_SYNTAX = re.compile(r" \| |\s\d*>(&\d+)?(\s|$)|\$\(")  # a pipe, a redirection, $(...)


def run_doc_command(
    text: str, place: Place, pid: int | None = None, fill: dict[str, str] | None = None
) -> Result:
    text = text.replace("[--steps FROM:TO]", "--steps 2:6")
    if SHELL_SYNTAX.search(text) or not text.startswith("torchdoctor "):
        return _shell(text, place)
    if text in place.results:  # run already, for the commands that read what it left
        return place.results[text]
    argv = _fill(shlex.split(text), place, pid, fill or {})
    verb = next((w for w in argv[1:] if not w.isdigit()), "")
    if verb in TRAINING_VERBS:
        return _shell(shlex.join(argv), place)
    return _in_process(argv, place)


def _judge(case: Case, result: Result, place: Place) -> None:
    assert result.code == case.code, result
    for pattern in case.out:
        assert re.search(pattern, result.out, re.M), f"stdout lacks {pattern!r}\n{result}"
    for pattern in case.err:
        assert re.search(pattern, result.err, re.M), f"stderr lacks {pattern!r}\n{result}"
    assert "torchdoctor: torchdoctor" not in result.out + result.err, result
    if case.check is not None:
        case.check(result, place)


# -- the tests ---------------------------------------------------------------------------------
def test_every_doc_command_has_a_case() -> None:
    written = {c.text for c in COMMANDS}
    missing = [str(c) for c in COMMANDS if c.text not in CASES]
    assert not missing, "doc commands without a case here:\n" + "\n".join(missing)
    stale = sorted(set(CASES) - written)
    assert not stale, f"cases of commands no doc has any more: {stale}"
    for case in CASES.values():
        if case.covered_by:
            path, _sep, name = case.covered_by.partition("::")
            assert f"def {name}(" in (ROOT / path).read_text(), case.covered_by


def _unique(commands: list[DocCommand]) -> list[DocCommand]:
    seen: dict[str, DocCommand] = {}
    for command in commands:
        seen.setdefault(command.text, command)
    return list(seen.values())


def _live_first(commands: list[DocCommand]) -> list[DocCommand]:
    """The commands run against the live runs first, so that those runs are ended after them
    rather than train through the whole module (a core's fifth each)."""
    return sorted(commands, key=lambda c: "live" not in (CASES.get(c.text) or Case()).needs)


LIVE_FIRST = _live_first(_unique(COMMANDS))


@pytest.mark.parametrize("command", LIVE_FIRST, ids=lambda c: f"{c.file}:{c.line}")
def test_doc_command(command: DocCommand, place: Place, request: pytest.FixtureRequest) -> None:
    try:
        _test_doc_command(command, place)
    finally:
        place.pending.pop(request.node.nodeid, None)
        if place.live and not any("live" in needs for needs in place.pending.values()):
            _end_live(place)


def _test_doc_command(command: DocCommand, place: Place) -> None:
    case = CASES.get(command.text)
    if case is None:
        pytest.fail(f"no case for {command}")
    if case.skip:
        pytest.skip(case.skip)
    if case.covered_by:
        pytest.skip(f"run verbatim by {case.covered_by}")
    _prepare(case, place)
    if "PID" in shlex.split(command.text.replace("[--steps FROM:TO]", "")):
        for name in case.live_scripts:
            run = place.live[name]
            result = run_doc_command(command.text, place, run.pid, case.fill)
            judged = case if name == "main" else _module_level(case, command.text)
            _judge(judged, result, place)
        return
    _judge(case, run_doc_command(command.text, place, fill=case.fill), place)


def _module_level(case: Case, text: str) -> Case:
    """The same command against the script whose objects are module-level globals."""
    if "eval" in text:
        return EVAL_MODULE_LEVEL
    return case
