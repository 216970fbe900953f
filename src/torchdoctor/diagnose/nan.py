"""`nan`: the first non-finite value, where it arose, and the likely causes, ranked.

Reads the `nan_origin` event (a NanOrigin) written by the replay (telemetry/nan_replay.py) and
the steps table; without that event (replay off or impossible) it still reports the first bad
step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from torchdoctor._json import Record
from torchdoctor.diagnose.evidence import Evidence, kind, optional
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.diagnose.story import LOWER_LR, lr_now

# Trained weights are of order 1: one this large was blown up by its updates, or never
# initialised (the memory to_empty() or torch.empty() leaves holds any bit pattern).
HUGE_WEIGHT = 1e4

_LOG = ("log", "log2", "log10", "log1p", "xlogy")
_SQRT = ("sqrt", "rsqrt", "pow")
_DIV = ("div", "true_divide", "reciprocal", "__truediv__", "__rtruediv__")
_NORM = ("norm", "vector_norm", "normalize", "linalg_vector_norm")
_FP16_MAX = 65504.0


@dataclasses.dataclass(kw_only=True)
class TensorStats(Record):
    """A tensor the replay met with non-finite values nearby: its shape and dtype, its NaN and
    Inf counts, and of its finite values (where it has some) the range, zeros and negatives."""

    shape: list[int]
    dtype: str
    nan: int
    inf: int
    min: float | None = optional()
    max: float | None = optional()
    zeros: int | None = optional()
    negatives: int | None = optional()


@dataclasses.dataclass(kw_only=True)
class BadGradient(Record):
    """A parameter whose gradient holds NaN or Inf."""

    param: str
    nan: int
    inf: int
    numel: int


@dataclasses.dataclass(kw_only=True)
class BadWeight(Record):
    """A parameter whose weights are not finite, or (`largest`) far too large."""

    module: str
    param: str
    numel: int
    largest: float | None = optional()


@dataclasses.dataclass(kw_only=True)
class NanOrigin(Record):
    """What the replay of the first non-finite step found. `stage` says where: forward (an op
    turned finite inputs non-finite), backward (an autograd node did), loss (the loss
    computation outside the modules), optimizer (the weights were already bad), data (the
    batch was), unknown (no replay possible: `note` says why)."""

    stage: str = "unknown"
    step: int | None = optional()
    location: str | None = optional()  # module, or file:line
    loss: float | None = optional()
    grad_norm: float | None = optional()
    lr: float | None = optional()
    guard: bool = False  # --guard skipped the update
    backward_site: str | None = optional()  # file:line of the backward() call
    autocast: dict[str, str] = dataclasses.field(default_factory=dict)  # device -> dtype
    bad_gradients: list[BadGradient] = dataclasses.field(default_factory=list)
    module: str | None = optional()  # forward/backward: the module the op or node belongs to
    op: str | None = optional()  # forward: the torch op; backward: the op that created the node
    site: str | None = optional()  # file:line of that op
    node: str | None = optional()  # backward: the autograd node (SqrtBackward0)
    shape: list[int] | None = optional()
    dtype: str | None = optional()
    nan: int | None = optional()
    inf: int | None = optional()
    numel: int | None = optional()
    inputs: list[TensorStats] = dataclasses.field(default_factory=list)  # the op's inputs
    input: TensorStats | None = optional()  # data: the bad batch tensor
    bad_weights: list[BadWeight] = dataclasses.field(default_factory=list)  # optimizer
    loss_graph: list[str] = dataclasses.field(default_factory=list)  # loss: nodes, loss first
    note: str | None = optional()
    replay_seconds: float | None = optional()
    sharded: bool | None = optional()  # True: a model holds DTensor shards (FSDP2, TP)
    # not replayed: the step's graph's ops that make NaN/Inf of ordinary values, nearest the
    # loss first (LogBackward0)
    graph_ops: list[str] = dataclasses.field(default_factory=list)
    # ... the module whose output the first of them takes (`module`: the one it feeds), read
    # from the parameters nearest it in the graph
    fed_by: str | None = optional()


@dataclasses.dataclass(kw_only=True)
class StepHistory(Record):
    """The steps before the first bad one: their numbers, losses and gradient norms."""

    steps: list[int]
    loss: list[float]
    grad_norm: list[float]


@dataclasses.dataclass(kw_only=True)
class Cause(Record):
    """A likely cause of the non-finite values, and its fix."""

    cause: str
    fix: str


@kind("nan")
@dataclasses.dataclass(kw_only=True)
class NanEvidence(Evidence):
    """A NanOrigin's fields (those it found), the steps' history and the ranked causes; without
    a replay, the first bad step's loss and gradient norm and the history."""

    stage: str | None = optional()
    step: int | None = optional()
    location: str | None = optional()
    loss: float | str | None = optional()  # a non-finite loss is its text ("nan")
    grad_norm: float | str | None = optional()
    lr: float | None = optional()
    guard: bool | None = optional()
    backward_site: str | None = optional()
    autocast: dict[str, str] | None = optional()
    bad_gradients: list[BadGradient] | None = optional()
    module: str | None = optional()
    op: str | None = optional()
    site: str | None = optional()
    node: str | None = optional()
    shape: list[int] | None = optional()
    dtype: str | None = optional()
    nan: int | None = optional()
    inf: int | None = optional()
    numel: int | None = optional()
    inputs: list[TensorStats] | None = optional()
    input: TensorStats | None = optional()
    bad_weights: list[BadWeight] | None = optional()
    loss_graph: list[str] | None = optional()
    note: str | None = optional()
    replay_seconds: float | None = optional()
    graph_ops: list[str] | None = optional()
    fed_by: str | None = optional()
    history: StepHistory | None = optional()
    causes: list[Cause] | None = optional()

    def has_no_cause(self) -> bool:
        return self.stage == "data"  # a bad batch: nothing before it led there


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    origins = inputs.events_of("nan_origin")
    if origins:
        return [from_origin(NanOrigin.from_json(origins[0]["data"]), inputs)]
    first = _first_bad_step(inputs)
    if first is None:
        return []
    step, loss, norm = first
    why = "it could not be replayed to find the origin."
    if inputs.events_of("nan_armed"):
        # seen on a GPU after its update; no later step came to be checked before its own
        why = (
            "its values came back from the GPU after its update, and no later step was "
            "checked before the run ended, so it was not replayed: run with --guard to check "
            "each step before its update."
        )
    return [
        Diagnosis(
            kind="nan",
            severity="error",
            step=step,
            summary=f"Step {step} went non-finite (loss {loss}, gradient norm {norm}); {why}",
            evidence=NanEvidence(loss=loss, grad_norm=norm, history=_history(inputs, step)),
            fix=_generic_fixes(),
        )
    ]


def from_origin(origin: NanOrigin, inputs: Inputs | None = None) -> Diagnosis:
    step = origin.step
    evidence = NanEvidence.from_json(origin.to_json())
    history = _history(inputs, step) if inputs is not None and step is not None else None
    if history is not None:
        evidence.history = history
    causes = rank_causes(origin, history)
    evidence.causes = causes
    summary = _summary(origin)
    fixes = [c.fix for c in causes]
    if origin.guard:
        summary += " The update was skipped (--guard): the weights are still finite."
    return Diagnosis(
        kind="nan",
        severity="error",
        step=step,
        location=origin.location,
        summary=summary,
        evidence=evidence,
        fix=fixes,
    )


def _summary(o: NanOrigin) -> str:
    step, bad = o.step, _count(o.nan, o.inf)
    if o.stage == "forward":
        return (
            f"First non-finite value at step {step}, in the forward pass of {o.module}: "
            f"{o.op} at {o.site} produced {bad} in a tensor of shape {o.shape} from finite "
            "inputs."
        )
    if o.stage == "backward":
        made = f", created by {o.op} at {o.site}" if o.op else ""
        return (
            f"First non-finite value at step {step}, in the backward pass of "
            f"{o.module or 'the model'}: {o.node} turned finite gradients into "
            f"{bad} (shape {o.shape}){made}. The forward pass was finite."
        )
    if o.stage == "loss":
        return (
            f"Step {step}: the model's outputs and their gradients are finite, but the loss "
            f"computed from them at {o.location} is not (loss = {o.loss}); its "
            f"graph: {' <- '.join(o.loss_graph[:5])}."
        )
    if o.stage == "optimizer":
        first = o.bad_weights[0] if o.bad_weights else None
        largest = first.largest if first else None
        module = first.module if first else None
        what = "non-finite" if largest is None else f"as large as {largest:.3g}"
        if step == 0:
            return (
                f"Step 0: the weights of {module} are {what} before the "
                "first update: the model was loaded or initialised with them."
            )
        return (
            f"Step {step}: the weights of {module} are already {what}: "
            "an earlier optimizer update put them there (its gradients were finite)."
        )
    if o.stage == "data":
        batch = o.input
        return (
            f"Step {step}: the input batch itself contains "
            f"{_count(batch.nan if batch else None, batch.inf if batch else None)}."
        )
    placed = o.module or o.fed_by  # from the step's graph, nothing run
    found = (
        f"Step {step} went non-finite; placed from the step's autograd graph ({o.note or ''})."
        if placed
        else f"Step {step} went non-finite; the origin could not be found ({o.note or ''})."
    )
    if o.graph_ops:
        found += (
            f" The step's graph holds {', '.join(o.graph_ops[:3])}: ops that make NaN or Inf "
            "of ordinary values (a log or a root of zero, a division by zero)."
        )
        between = [
            f"takes the output of {o.fed_by}" if o.fed_by else "",
            f"feeds {o.module}" if o.module else "",
        ]
        if any(between):
            found += f" The first of them {' and '.join(b for b in between if b)}."
    return found


def _count(nan: int | None, inf: int | None) -> str:
    parts = []
    if nan:
        parts.append(f"{nan} NaN")
    if inf:
        parts.append(f"{inf} Inf")
    return " and ".join(parts) or "non-finite values"


def rank_causes(o: NanOrigin, history: StepHistory | None = None) -> list[Cause]:
    """The likely causes for what the replay found, most likely first, each with its fix."""
    stage = o.stage
    op = (o.op or "").lower()
    node = (o.node or "").lower()
    first_in = o.inputs[0] if o.inputs else None
    causes: list[tuple[float, str, str]] = []

    def add(weight: float, cause: str, fix: str) -> None:
        causes.append((weight, cause, fix))

    # Not replayed (a sharded model): the graph's risky ops stand for the op, as candidates.
    graph = stage == "unknown" and bool(o.graph_ops)
    name = " ".join([op, node, *(g.lower() for g in o.graph_ops if graph)])
    if any(k in name for k in _LOG):
        zeros = (first_in.zeros or 0) + (first_in.negatives or 0) if first_in else 0
        add(
            0.9 if zeros or stage == "forward" or graph else 0.7,
            "log of zero or negative values" + (f" ({zeros} inputs <= 0)" if zeros else ""),
            "clamp before the log: torch.log(x.clamp(min=1e-8)); for probabilities use "
            "F.log_softmax / F.cross_entropy on logits instead of log(softmax(x))",
        )
    if any(k in name for k in _SQRT):
        add(
            0.9,
            "square root at zero or below: sqrt(0) is finite but its gradient is infinite, and "
            "sqrt of a negative is NaN",
            "keep the argument positive: torch.sqrt(x.clamp(min=1e-12)) or torch.sqrt(x + eps)",
        )
    if any(k in name for k in _NORM):
        add(
            0.85,
            "the norm of an all-zero vector: its gradient x / ||x|| is 0/0",
            "add an epsilon: x / (x.norm(dim=-1, keepdim=True) + 1e-8), "
            "or F.normalize(x, eps=1e-8)",
        )
    if any(k in name for k in _DIV):
        add(
            0.85,
            "division by zero (a sum, norm, count or std that can be 0)",
            "add an epsilon to the denominator: x / (d + 1e-8)",
        )
    if "exp" in name or "softmax" in name:
        add(
            0.7,
            "overflow in exp: large logits exceed the float range",
            "use F.softmax / F.log_softmax (they subtract the max), or scale the logits down",
        )
    dtype = str(o.dtype or "")
    autocast = o.autocast
    if dtype == "float16" or "float16" in autocast.values():
        add(
            0.8 if dtype == "float16" else 0.5,
            f"float16 overflow: values beyond +-{_FP16_MAX:g} become Inf",
            "train in bfloat16 (torch.autocast(device_type, dtype=torch.bfloat16)), or keep "
            "float16 with torch.amp.GradScaler",
        )
    if stage == "data":
        add(
            1.0,
            "the data: the batch already holds NaN/Inf before the model sees it",
            "check the dataset and its transforms; drop or repair bad samples "
            "(assert torch.isfinite(x).all() in the loader while debugging)",
        )
    loaded = stage == "optimizer" and o.step == 0  # no update has run yet
    if loaded:
        add(
            1.0,
            "the weights were non-finite (or far too large) before any update: a damaged "
            "checkpoint, or an initialisation that overflows",
            "find them before training: assert all(torch.isfinite(p).all() for p in "
            "model.parameters()) after loading; load the checkpoint again from a good copy, or "
            "fix the initialisation",
        )
        add(
            1.05 if o.sharded else 0.9,  # FSDP2 models are built on the meta device
            "weights never initialised: a model built on the meta device and given memory by "
            "to_empty() (the FSDP2 way) holds whatever that memory held until each module's "
            "own initialisation runs",
            "after to_empty(), initialise every submodule, not only the root: for m in "
            "model.modules(): m.reset_parameters() where it has one (a root's "
            "reset_parameters() does not recurse)",
        )
    elif stage == "optimizer":
        add(
            0.95,
            "the update itself: finite gradients but a step so large (or an Adam eps so small) "
            "that the weights overflowed",
            f"{LOWER_LR} {lr_now(o.lr)} (add warm-up), clip gradients "
            "(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)), keep Adam eps >= 1e-8",
        )
    if stage == "loss":
        add(
            0.9,
            "the loss computation: log(0), division by a zero count, or a hand-written "
            "cross-entropy on probabilities",
            "use F.cross_entropy on raw logits; clamp before log; guard divisions with an eps",
        )
    # An op the replay caught making the first NaN from finite values (log, sqrt, a norm, a
    # division) is a cause of its own: the learning rate is blamed only when the history shows
    # the run growing first.
    local = any(any(k in name for k in ops) for ops in (_LOG, _SQRT, _NORM, _DIV))
    local = local and stage in ("forward", "backward")
    losses = [v for v in (history.loss if history else []) if v is not None and math.isfinite(v)]
    losses = [v for v in losses if v > 0]
    diverged = len(losses) >= 3 and losses[-1] > 1e3 * min(losses)
    if diverged:
        add(
            0.97,
            f"the run diverged first: the loss grew {losses[-1] / min(losses):.3g}x in "
            f"{len(losses)} steps before overflowing",
            f"{LOWER_LR} {lr_now(o.lr)}, add warm-up and gradient clipping",
        )
    norms = [
        n for n in (history.grad_norm if history else []) if n is not None and math.isfinite(n)
    ]
    rising = len(norms) >= 4 and norms[-1] > 10 * (np.median(norms[: len(norms) // 2]) or 1e-12)
    if stage == "unknown" and o.sharded:
        add(
            0.8,
            "not found on this rank: its weights and batch are finite, and a sharded model is "
            "not run again; another rank's shard may hold the non-finite weights",
            "read every rank's finding of this step (torchdoctor diagnoses JOB_DIR): a rank "
            "whose shard holds non-finite weights names their module",
        )
    # the update's own cause already says it; before the first update (step 0), nothing the
    # rate or clipping did
    if stage != "optimizer" and o.step != 0 and (rising or diverged or not local):
        add(
            0.75 if rising else 0.35,
            "learning rate too high"
            + (" (the gradient norm grew before the NaN)" if rising else ""),
            f"{LOWER_LR} {lr_now(o.lr)} or add warm-up",
        )
        add(
            0.6 if rising else 0.3,
            "no gradient clipping: one large batch can push the weights to Inf",
            "clip: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)",
        )
    if stage not in ("data",) and not loaded:
        add(
            0.2,
            "bad samples in the data",
            "check the batch at this step for NaN/Inf or out-of-range values",
        )
    causes.sort(key=lambda c: -c[0])
    seen: set[str] = set()
    out = []
    for _w, cause, fix in causes:
        if cause in seen:
            continue
        seen.add(cause)
        out.append(Cause(cause=cause, fix=fix))
    return out


def _generic_fixes() -> list[str]:
    return [c.fix for c in rank_causes(NanOrigin())]


def _first_bad_step(inputs: Inputs) -> tuple[int, Any, Any] | None:
    if not inputs.steps.rows:
        return None
    loss = inputs.column("loss")
    norm = inputs.column("grad_norm")
    bad = (inputs.valid("loss") & ~np.isfinite(loss)) | (
        inputs.valid("grad_norm") & ~np.isfinite(norm)
    )
    idx = np.flatnonzero(bad)
    if not idx.size:
        return None
    i = int(idx[0])
    return int(inputs.column("step")[i]), float(loss[i]), float(norm[i])


def _history(inputs: Inputs, step: int, n: int = 10) -> StepHistory:
    steps = inputs.column("step")
    keep = np.flatnonzero(steps < step)[-n:]
    loss = inputs.steps.column("loss")
    norm = inputs.steps.column("grad_norm")
    return StepHistory(
        steps=[int(steps[i]) for i in keep],
        loss=[loss[i] for i in keep],
        grad_norm=[norm[i] for i in keep],
    )
