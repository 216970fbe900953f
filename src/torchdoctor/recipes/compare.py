"""Two repro runs compared: pure functions of the repro mode's results (ReproMode.result).

Bit-identical means: the same number of steps, and at every step the same losses, gradient
norm and parameter contents (digests of their bytes), with the same parameters at the first
model call. The first difference is looked for in the order things happen: the initial
parameters; then, step by step, the batch given to the model, the ops' outputs in order (the
first one that differs names its op, the innermost module it ran in and its call site), the
loss, the gradients, the parameters after the update. The fix is the part of the seeds' ritual
the script lacks: only the sources seen drawn from without a seed."""

from __future__ import annotations

import dataclasses
from typing import Any

SEED = 0

SOURCES: dict[str, tuple[str, str]] = {
    # name: (what it is, the line of the ritual that fixes it)
    "random": ("Python's random module", f"random.seed({SEED})"),
    "numpy": ("NumPy's global generator (np.random.*)", f"np.random.seed({SEED})"),
    "numpy_generator": (
        "a NumPy Generator made without a seed (np.random.default_rng())",
        f"np.random.default_rng({SEED})",
    ),
    "torch_cpu": ("torch's CPU generator", f"torch.manual_seed({SEED})"),
    "torch_cuda": (
        "torch's CUDA generators",
        f"torch.manual_seed({SEED})  # seeds every CUDA device too (or torch.cuda.manual_seed_all)",
    ),
    "dataloader_workers": (
        "DataLoader workers seeded from an unseeded base seed",
        f"g = torch.Generator(); g.manual_seed({SEED}); DataLoader(..., generator=g, "
        "worker_init_fn=seed_worker)  # seed_worker seeds random and numpy from "
        "torch.initial_seed() % 2**32",
    ),
    "cudnn_benchmark": (
        "cudnn.benchmark = True (the autotuner may pick another kernel each run)",
        "torch.backends.cudnn.benchmark = False; torch.backends.cudnn.deterministic = True",
    ),
    "nondeterministic_ops": (
        "CUDA ops without a deterministic implementation (atomic adds)",
        "torch.use_deterministic_algorithms(True)  # and export CUBLAS_WORKSPACE_CONFIG=:4096:8",
    ),
}
ORDER = list(SOURCES)
Value = float | str | None  # a loss or gradient norm as the run wrote it ("nan" as text)


@dataclasses.dataclass(frozen=True)
class OtherOp:
    """The op the second run called where the first called another (control flow differs)."""

    op: str
    module: str | None
    site: str | None


@dataclasses.dataclass(frozen=True)
class FirstDifference:
    """Where the two runs first differ: the step, what differed, and the op that made it
    (with its module and call site) where one is known. In the JSON an op's fields come only
    with the op, `module_type` only with a module."""

    step: int
    what: str  # initial_params, batch, op, loss, gradients, grad_norm, update, steps
    detail: str
    param: str | None = None  # the parameter that differs
    op_index: int | None = None
    op: str | None = None
    module: str | None = None
    site: str | None = None
    other: OtherOp | None = None
    detail_op: str | None = None
    module_type: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "what": self.what, "detail": self.detail}
        if self.param is not None:
            out["param"] = self.param
        if self.op is not None:
            out.update(op_index=self.op_index, op=self.op, module=self.module, site=self.site)
        if self.other is not None:
            out["other"] = self.other
            out["detail_op"] = self.detail_op
        if self.module:
            out["module_type"] = self.module_type
        return out


@dataclasses.dataclass(frozen=True)
class StepComparison:
    """One step of both runs side by side."""

    step: int
    loss: tuple[float | None, float | None]
    grad_norm: tuple[Value, Value]
    loss_equal: bool
    grad_norm_equal: bool
    params_equal: bool


@dataclasses.dataclass(frozen=True)
class UnseededSource:
    """A source of randomness drawn from before any seed, and the ritual's line that fixes it."""

    source: str
    title: str
    uses: int
    sites: list[str]
    fix: str


@dataclasses.dataclass(frozen=True)
class Environment:
    pythonhashseed: str | None
    str_hash_differs: bool
    cuda_used: bool
    deterministic_algorithms: bool
    cudnn_benchmark: bool


@dataclasses.dataclass(frozen=True)
class ScriptEnding:
    """How the script ended in one run (recipe_run's child writes it)."""

    stopped_by_torchdoctor: bool
    exit_code: int | None
    exception: str | None
    interrupted: bool

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ScriptEnding | None:
        if data is None:
            return None
        return cls(
            stopped_by_torchdoctor=bool(data.get("stopped_by_torchdoctor")),
            exit_code=data.get("exit_code"),
            exception=data.get("exception"),
            interrupted=bool(data.get("interrupted")),
        )


@dataclasses.dataclass(frozen=True)
class ReproVerdict:
    """Two repro runs compared: what `torchdoctor repro` prints (and writes as JSON)."""

    identical: bool
    steps: tuple[int, int]  # the steps each run took
    limit: int | None
    first_difference: FirstDifference | None
    series: list[StepComparison]
    sources: list[UnseededSource]
    environment: Environment
    fix: list[str]
    runs: list[str | None] = dataclasses.field(default_factory=list)  # the run directories
    script: list[ScriptEnding | None] = dataclasses.field(default_factory=list)


def compare(a: dict[str, Any], b: dict[str, Any]) -> ReproVerdict:
    """The verdict on two runs' results (ReproMode.result, as the child wrote them)."""
    steps = min(len(a["trace"]), len(b["trace"]))
    rows = []
    for k in range(steps):
        x, y = a["trace"][k], b["trace"][k]
        rows.append(
            StepComparison(
                step=k,
                loss=(_loss(x), _loss(y)),
                grad_norm=(x["grad_norm"], y["grad_norm"]),
                loss_equal=x["loss"] == y["loss"],
                grad_norm_equal=x["grad_norm"] == y["grad_norm"],
                params_equal=x["params"] == y["params"],
            )
        )
    first = first_difference(a, b)
    if first is not None and first.module:
        module_type = (a.get("module_types") or {}).get(first.module)
        first = dataclasses.replace(first, module_type=module_type)
    identical = (
        first is None
        and len(a["trace"]) == len(b["trace"])
        and all(r.loss_equal and r.grad_norm_equal and r.params_equal for r in rows)
    )
    if first is None and not identical:
        first = FirstDifference(
            step=steps, what="steps", detail="the runs took different numbers of steps"
        )
    sources = unseeded(a, b)
    env = environment(a, b)
    return ReproVerdict(
        identical=identical,
        steps=(len(a["trace"]), len(b["trace"])),
        limit=a.get("limit"),
        first_difference=first,
        series=rows,
        sources=sources,
        environment=env,
        fix=fix(sources, env, identical),
    )


def _loss(row: dict[str, Any]) -> float | None:
    losses = [float(v) for v in row["loss"]]  # "nan" and "inf" come back as text
    return sum(losses) / len(losses) if losses else None


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> FirstDifference | None:
    diff = _named_diff(a.get("initial_params") or [], b.get("initial_params") or [])
    if diff is not None and a["trace"] and b["trace"]:
        x, y = a["trace"][0], b["trace"][0]
        # the parameters are made before the model's first call
        op = _first_op(x["ops"][: x.get("forward_at")], y["ops"][: y.get("forward_at")])
        return FirstDifference(
            step=0,
            what="initial_params",
            detail=f"the parameters differ before the first step: {diff} first",
            param=diff,
            **(op or {}),
        )
    for k in range(min(len(a["trace"]), len(b["trace"]))):
        x, y = a["trace"][k], b["trace"][k]
        fx, fy = x.get("forward_at"), y.get("forward_at")
        if x["batch"] != y["batch"]:
            # where the batch was made: an op of the DataLoader, else the last op before the
            # model's first call (the step's own data code)
            op = _first_op(x["ops"], y["ops"], only="DataLoader") or _last_op(
                x["ops"][:fx], y["ops"][:fy]
            )
            return FirstDifference(
                step=k, what="batch", detail="the batch given to the model differs", **(op or {})
            )
        # step 0's ops before the model's first call include building it: when the parameters
        # and the batch match, what differed there did not reach the training
        start = (fx or 0) if k == 0 else 0
        op = _first_op(x["ops"][start:], y["ops"][start:])
        if op is not None:
            return FirstDifference(step=k, what="op", detail="an op's output differs", **op)
        if x["loss"] != y["loss"]:
            return FirstDifference(step=k, what="loss", detail="the loss differs")
        diff = _named_diff(x["grads"], y["grads"])
        if diff is not None:
            return FirstDifference(
                step=k,
                what="gradients",
                detail=f"every op of the step matched, but the gradient of {diff} differs: "
                "the backward pass is not deterministic",
                param=diff,
            )
        if x["grad_norm"] != y["grad_norm"]:
            return FirstDifference(step=k, what="grad_norm", detail="the gradient norm differs")
        diff = _named_diff(x["params"], y["params"])
        if diff is not None:
            return FirstDifference(
                step=k,
                what="update",
                detail=f"the gradients matched, but the update of {diff} differs",
                param=diff,
            )
    return None


def _named_diff(x: list[list[Any]], y: list[list[Any]]) -> str | None:
    for (name, dx), (_n, dy) in zip(x, y, strict=False):
        if dx != dy:
            return str(name)
    if len(x) != len(y):
        return "(the number of parameters)"
    return None


def _last_op(x: list[list[Any]], y: list[list[Any]]) -> dict[str, Any] | None:
    """The last op whose output differs, of two runs' op lists of the same shape."""
    if len(x) != len(y):
        return None
    for i in range(len(x) - 1, -1, -1):
        if x[i][2] != y[i][2] and x[i][2] is not None:
            return {"op_index": i, "op": x[i][0], "module": x[i][1], "site": x[i][3]}
    return None


def _first_op(
    x: list[list[Any]], y: list[list[Any]], only: str | None = None
) -> dict[str, Any] | None:
    """The first op whose output differs (or where the runs called different ops); `only`:
    among the ops of that module."""
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if only is not None and p[1] != only:
            continue
        if p[0] != q[0] or p[1] != q[1]:
            return {
                "op_index": i,
                "op": p[0],
                "module": p[1],
                "site": p[3],
                "other": OtherOp(op=q[0], module=q[1], site=q[3]),
                "detail_op": "the runs called different ops here (control flow differs)",
            }
        if p[2] != q[2]:
            return {"op_index": i, "op": p[0], "module": p[1], "site": p[3]}
    return None


def unseeded(a: dict[str, Any], b: dict[str, Any]) -> list[UnseededSource]:
    """The sources drawn from before a seed in either run, in the ritual's order."""
    out = []
    for name in ORDER:
        seen = [r["sources"].get(name) for r in (a, b) if r["sources"].get(name)]
        used = [s for s in seen if s["unseeded_uses"] > 0]
        if not used:
            continue
        sites: list[str] = []
        for s in used:
            sites += [x for x in s["sites"] if x not in sites]
        what, line = SOURCES[name]
        out.append(
            UnseededSource(
                source=name,
                title=what,
                uses=max(s["unseeded_uses"] for s in used),
                sites=sites,
                fix=line,
            )
        )
    return out


def environment(a: dict[str, Any], b: dict[str, Any]) -> Environment:
    return Environment(
        pythonhashseed=a.get("pythonhashseed"),
        str_hash_differs=a.get("str_hash") != b.get("str_hash"),
        cuda_used=bool(a.get("cuda_used") or b.get("cuda_used")),
        deterministic_algorithms=bool(a.get("deterministic_algorithms")),
        cudnn_benchmark=bool(a.get("cudnn_benchmark")),
    )


def fix(sources: list[UnseededSource], env: Environment, identical: bool) -> list[str]:
    """The ritual's missing lines, before the first random draw (the top of the script)."""
    lines = [s.fix for s in sources]
    if not identical and not sources and env.str_hash_differs:
        # nothing else explains it: set and dict order of strings changes between runs
        lines.append(f"export PYTHONHASHSEED={SEED} before python starts (setting it inside the "
                     "script is too late for that process)")  # fmt: skip
    return lines
