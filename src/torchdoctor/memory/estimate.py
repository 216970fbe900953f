"""What each out-of-memory fix would save on this run, estimated from the measured breakdown.

Pure functions over two records: a Breakdown (bytes by kind, as the census measured them at the
failure) and a Situation (the asked size, the capacity, the batch size, dtypes, optimizer...).
Each estimate says how it was made; docs/memory.md gives the rules and how close they came to
measurement.

The rules:
  autocast        bf16/fp16 autocast stores activations in 16 bits: saves half of the float32
                  activations, less the 16-bit copies of the float32 weights it keeps for the
                  backward (half the float32 parameter bytes).
  checkpointing   checkpoint each of the L repeated blocks: keeps each block's input (1/k of
                  its activations, k = tensors saved per block) and one block recomputed in
                  the backward: saves activations * (1 - 1/L - 1/k).
  batch size      activations scale with the batch: per sample = (activations + 2 x the
                  largest activation, the backward's gradients) / batch; the largest N that
                  fits in HEADROOM of (activations held + memory still available), with
                  K = ceil(B/N) accumulation steps for the same effective batch.
  8-bit optimizer Adam's two float32 states in 8 bits: saves 75% of the optimizer state (or of
                  2 x the trainable parameters before the first step created it).
  expandable      cached-but-unused memory (reserved - allocated) that fragmentation keeps from
  segments        being reused: expandable segments make it usable again.
  set_to_none     gradients still held while the forward runs: zero_grad(set_to_none=True)
                  frees them.
  sharding        parameters + gradients + optimizer state over W GPUs with FSDP/ZeRO: saves
                  (1 - 1/W) of them (not offered for a model already sharded).

A sharded model (FSDP2, tensor parallel): the Breakdown is this rank's local shards, and FSDP2
materialises one unit's parameters whole during its forward and backward: the batch plan keeps
room for the largest unit's all-gather (less what is held whole at the failure).
  the allocation  a single request larger than the whole memory: no setting fixes it.
  holders         graphs kept alive from one step to the next (a list of losses): releasing
                  them saves what they hold.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from torchdoctor.units import human

SIXTEEN_BIT = ("bfloat16", "float16")
ADAM_LIKE = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "AdamW8bit", "FusedAdam", "Lamb")
HEADROOM = 0.9  # share of the capacity a plan may fill: the allocator needs some slack
TRIVIAL = 0.01  # fixes saving less than this share of the shortfall are left out


@dataclasses.dataclass
class Breakdown:
    """Bytes at the failure, by kind, on the device that ran out."""

    parameters: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    buffers: int = 0
    activations: int = 0
    other: int = 0
    cached_unused: int | None = None  # CUDA: reserved - allocated; None on CPU

    @property
    def model_state(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.buffers

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Situation:
    device: str = "cpu"  # "cuda" or "cpu"
    asked: int | None = None  # the allocation that failed
    capacity: int | None = None  # what this process may use (device total, fraction cap, RAM)
    available: int | None = None  # what was still free for it when the allocation failed
    phase: str = "other"
    batch_size: int | None = None
    activation_dtypes: dict[str, int] = dataclasses.field(default_factory=dict)  # bytes by dtype
    optimizer: str | None = None  # class name of the (primary) optimizer
    trainable_bytes: int = 0  # bytes of parameters with requires_grad
    layers: int | None = None  # repeated blocks (the longest ModuleList / Sequential)
    expandable_segments: bool = False  # already on
    devices: int = 1  # GPUs on the machine (sharding)
    held_by_globals: int = 0  # bytes kept alive by graphs held in the script's globals
    holder: str | None = None  # the biggest such holder ("__main__.losses")
    location: str | None = None
    largest_activation: int = 0  # bytes of the largest activation tensor held
    activation_tensors: int = 0  # how many activation tensors held them
    float32_parameters: int = 0  # bytes of float32 parameters (autocast copies them to 16 bits)
    # A sharded model (FSDP2, tensor parallel): every byte above is this rank's local shards.
    world: int = 1  # ranks the sharded tensors span; 1: nothing sharded
    all_gather: int = 0  # bytes the largest FSDP2 unit materialises whole for its forward/backward
    all_gather_unit: str | None = None
    gathered: int = 0  # bytes of FSDP2 units' parameters held whole at the failure

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Situation:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclasses.dataclass
class FixEstimate:
    code: str  # stable: allocation, autocast, checkpointing, batch_size, optimizer_8bit, ...
    saving: int  # estimated bytes saved on this run
    text: str  # what to do, with the saving in human units
    enough: bool | None = None  # the saving alone covers the shortfall (None: unknown)
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def shortfall(b: Breakdown, s: Situation) -> int | None:
    """How many more bytes the failed allocation needed than were available."""
    if s.asked is None or s.available is None:
        return None
    return max(0, s.asked - max(0, s.available))


def plausible_request(s: Situation) -> int:
    """The failed request when it was one more activation (or activation gradient): asked in
    the forward or the backward, and not larger than the whole capacity."""
    if s.phase not in ("forward", "backward") or not s.asked:
        return 0
    return s.asked if s.capacity is None or s.asked < s.capacity else 0


def activations_needed(b: Breakdown, s: Situation) -> int:
    """Activations of the step: the ones held at the failure plus the failed request."""
    return b.activations + plausible_request(s)


def step_peak(b: Breakdown, s: Situation) -> int:
    """Activation memory at the step's peak: early in the backward every activation is still
    held while the gradients of the largest ones are being computed (about two of them)."""
    largest = max(s.largest_activation, plausible_request(s))
    return activations_needed(b, s) + 2 * largest


def all_gather_to_come(s: Situation) -> int:
    """What FSDP2 will still materialise above the local shards: the largest unit's parameters
    whole, less what is held whole already (the unit running at the failure)."""
    return max(0, s.all_gather - s.gathered)


def float32_share(s: Situation) -> float:
    """Share of activation bytes in float32 (1.0 when unknown)."""
    total = sum(s.activation_dtypes.values())
    if total <= 0:
        return 1.0
    return s.activation_dtypes.get("float32", 0) / total


def autocast_on(s: Situation) -> bool:
    total = sum(s.activation_dtypes.values())
    half = sum(v for k, v in s.activation_dtypes.items() if k in SIXTEEN_BIT)
    return total > 0 and half >= 0.5 * total


def estimate_autocast(b: Breakdown, s: Situation) -> FixEstimate | None:
    if autocast_on(s):
        return None
    fp32 = int(activations_needed(b, s) * float32_share(s))
    if fp32 <= 0:
        return None
    # Autocast keeps a 16-bit copy of each float32 weight a matmul uses, for the backward.
    copies = s.float32_parameters // 2
    saving = fp32 // 2 - copies
    if saving <= 0:
        return None
    kind = "cuda" if s.device == "cuda" else "cpu"
    cost = f", less {human(copies)} of 16-bit weight copies" if copies else ""
    text = (
        f"bf16 autocast (`with torch.autocast('{kind}', dtype=torch.bfloat16):` around the "
        f"forward and loss) about halves the {human(fp32)} of float32 activations{cost}: "
        f"saves ≈ {human(saving)}"
    )
    return FixEstimate(
        "autocast", saving, text, detail={"float32_activations": fp32, "copies": copies}
    )


def estimate_checkpointing(b: Breakdown, s: Situation) -> FixEstimate | None:
    layers = s.layers or 0
    acts = activations_needed(b, s)
    if layers < 3 or acts <= 0:
        return None
    # Kept: each block's input (1/k of a block's activations, k = tensors saved per block)
    # and, during the backward, one block recomputed.
    per_block = s.activation_tensors / layers if s.activation_tensors else layers
    k = max(1.0, per_block)
    saving = int(acts * max(0.0, 1 - 1 / layers - 1 / k))
    if saving <= 0:
        return None
    text = (
        f"activation checkpointing of each of the {layers} blocks "
        f"(torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)) keeps only the "
        f"blocks' inputs and recomputes one block at a time in the backward (about one more "
        f"forward pass of compute): of the {human(acts)} of activations, saves ≈ {human(saving)}"
    )
    return FixEstimate("checkpointing", saving, text, detail={"layers": layers, "per_block": k})


def plan_batch(b: Breakdown, s: Situation) -> dict[str, Any] | None:
    """The largest batch that fits, and the accumulation that keeps the effective batch.

    The activations' budget is what they held at the failure plus what was still available
    then (or, without that reading, the capacity less everything else); a plan fills at most
    HEADROOM of it, since later phases of the step need some more."""
    batch = s.batch_size or 0
    acts = step_peak(b, s)
    if batch < 2 or activations_needed(b, s) <= 0:
        return None
    per_sample = acts / batch
    if s.available is not None:
        budget = b.activations + max(0, s.available)
    elif s.capacity:
        budget = s.capacity - b.model_state - b.other
    else:
        return None
    budget -= all_gather_to_come(s)  # FSDP2: a unit's parameters whole, during its forward
    if s.optimizer in ADAM_LIKE and b.optimizer_state == 0 and s.trainable_bytes:
        budget -= 2 * s.trainable_bytes  # the first optimizer step creates the states
    room = budget * HEADROOM
    fits = int(room // per_sample) if per_sample > 0 else 0
    if fits >= batch:
        return None
    plan: dict[str, Any] = {
        "batch_size": batch,
        "per_sample": int(per_sample),
        "room": int(room),
        "fits": max(0, fits),
    }
    if fits < 1:
        return plan
    steps = math.ceil(batch / fits)
    for k in range(steps, min(batch, 2 * steps) + 1):  # an exact split when there is one
        if batch % k == 0:
            steps = k
            break
    micro = math.ceil(batch / steps)
    plan.update(micro_batch=micro, accumulation=steps, effective=micro * steps)
    plan["saving"] = int(per_sample * (batch - micro))
    return plan


def estimate_batch(b: Breakdown, s: Situation) -> FixEstimate | None:
    plan = plan_batch(b, s)
    if plan is None or "micro_batch" not in plan:
        return None
    text = (
        f"batch size {plan['micro_batch']} with {plan['accumulation']} gradient accumulation "
        f"steps (effective batch {plan['effective']}, was {plan['batch_size']}; divide the loss "
        f"by {plan['accumulation']}): the step takes ≈ {human(plan['per_sample'])} of "
        f"activations per sample, saves ≈ {human(plan['saving'])}"
    )
    return FixEstimate("batch_size", plan["saving"], text, detail=plan)


def estimate_optimizer(b: Breakdown, s: Situation) -> FixEstimate | None:
    if s.optimizer not in ADAM_LIKE or s.optimizer == "AdamW8bit":
        return None
    state = b.optimizer_state
    projected = False
    if state == 0 and s.trainable_bytes:
        state, projected = 2 * s.trainable_bytes, True
    if state <= 0:
        return None
    saving = int(state * 0.75)
    when = " (the first step will create them)" if projected else ""
    text = (
        f"an 8-bit optimizer (bitsandbytes.optim.AdamW8bit instead of {s.optimizer}) keeps "
        f"the two moment states in 8 bits: saves ≈ 75% of the {human(state)} of optimizer "
        f"state{when} = {human(saving)}"
    )
    return FixEstimate(
        "optimizer_8bit", saving, text, detail={"state": state, "projected": projected}
    )


def estimate_expandable(b: Breakdown, s: Situation) -> FixEstimate | None:
    cached = b.cached_unused or 0
    if s.device != "cuda" or s.expandable_segments or cached <= 0:
        return None
    reserved = b.model_state + b.activations + b.other + cached
    if cached < (s.asked or 0) and cached < 0.1 * reserved:
        return None  # little fragmentation: not the problem
    text = (
        f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set before the first CUDA call): "
        f"{human(cached)} is reserved by PyTorch but unused, kept back by fragmentation; "
        f"expandable segments let it be reused: frees up to ≈ {human(cached)}"
    )
    return FixEstimate("expandable_segments", cached, text)


def estimate_set_to_none(b: Breakdown, s: Situation) -> FixEstimate | None:
    if s.phase != "forward" or b.gradients <= 0:
        return None
    text = (
        f"the previous step's gradients ({human(b.gradients)}) are still held while the "
        f"forward runs: call optimizer.zero_grad(set_to_none=True) before the forward: saves "
        f"≈ {human(b.gradients)} at this point"
    )
    return FixEstimate("set_to_none", b.gradients, text)


def estimate_sharding(b: Breakdown, s: Situation) -> FixEstimate | None:
    state = b.parameters + b.gradients + b.optimizer_state
    if s.device != "cuda" or not s.capacity or state < 0.5 * s.capacity or s.world > 1:
        return None  # (a sharded model's state above is already its local shards)
    world = max(2, s.devices)
    saving = int(state * (1 - 1 / world))
    text = (
        f"parameters, gradients and optimizer state alone take {human(state)} "
        f"({state / s.capacity:.0%} of {human(s.capacity)}): shard them over {world} GPUs with "
        f"FSDP (torch.distributed.fsdp.fully_shard) or ZeRO: saves ≈ {human(saving)} per GPU"
    )
    return FixEstimate("sharding", saving, text, detail={"world_size": world})


def estimate_allocation(b: Breakdown, s: Situation) -> FixEstimate | None:
    if s.asked is None or not s.capacity or s.asked <= s.capacity:
        return None
    where = f" in {s.location}" if s.location else ""
    text = (
        f"one allocation asks for {human(s.asked)}, more than all of the {human(s.capacity)} "
        f"this process can use: no batch size or setting makes that fit; check the shape of "
        f"the tensor being created{where} (a wrong dimension, an outer product, a broadcast)"
    )
    return FixEstimate("allocation", s.asked, text)


def estimate_holders(b: Breakdown, s: Situation) -> FixEstimate | None:
    if s.held_by_globals <= 0:
        return None
    who = s.holder or "a global container"
    text = (
        f"{who} keeps tensors with their autograd graphs alive from step to step "
        f"({human(s.held_by_globals)}): store loss.item() or tensor.detach() instead: "
        f"saves ≈ {human(s.held_by_globals)}"
    )
    return FixEstimate("holders", s.held_by_globals, text)


ESTIMATORS = (
    estimate_allocation,
    estimate_holders,
    estimate_batch,
    estimate_autocast,
    estimate_checkpointing,
    estimate_optimizer,
    estimate_expandable,
    estimate_set_to_none,
    estimate_sharding,
)


def rank_fixes(b: Breakdown, s: Situation) -> list[FixEstimate]:
    """Every fix that applies, the biggest estimated saving first."""
    missing = shortfall(b, s)
    fixes = []
    for estimator in ESTIMATORS:
        fix = estimator(b, s)
        if fix is None or fix.saving <= 0:
            continue
        if missing is not None and fix.code != "allocation":
            fix.enough = fix.saving >= missing
            if fix.saving < TRIVIAL * missing:
                continue  # a saving this small against the shortfall is noise
        fixes.append(fix)
    fixes.sort(key=lambda f: (f.code != "allocation", -f.saving))
    return fixes


def repeated_blocks(model: Any) -> int | None:
    """L for checkpointing: the length of the longest ModuleList / Sequential in a model."""
    best = 0
    try:
        for module in model.modules():
            kind = type(module).__name__
            if kind in ("ModuleList", "Sequential"):
                best = max(best, len(module))
    except Exception:
        return None
    return best or None
