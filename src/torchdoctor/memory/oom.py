"""Out-of-memory capture: when an allocation fails, gather the numbers before the process dies.

`find_oom(exc)` recognises an out-of-memory error in the exception that ended the script (CUDA
`torch.OutOfMemoryError`, "CUDA out of memory", CPU "DefaultCPUAllocator: can't allocate
memory", ...) and reads its message's fields. `capture` runs while the traceback still holds
every frame, so the tensors of the failed step are still alive: it finds the step, the phase and
the module that asked, takes the tensor census, reads the allocator or the host memory, and
returns the OomEvidence that torchdoctor.diagnose.oom turns into the diagnosis.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchdoctor.errors.oom_message import OomMessage, parse
from torchdoctor.failure import first_arg, frame_locals, frames_of, locate, module_name, phase_of
from torchdoctor.memory.census import Census, Sharding, local_nbytes, take_census
from torchdoctor.memory.cuda_history import dump_snapshot
from torchdoctor.memory.estimate import Breakdown, Situation, repeated_blocks
from torchdoctor.memory.evidence import OomEvidence
from torchdoctor.memory.holders import Holder, find_holders
from torchdoctor.memory.host import host_memory
from torchdoctor.memory.phases import from_engine
from torchdoctor.units import human
from torchdoctor.views import TrainingView


def parse_message(text: str) -> OomMessage | None:
    """The fields of an out-of-memory message (the grammar `explain` uses), or None."""
    return parse(text)


def find_oom(exc: BaseException) -> tuple[BaseException, OomMessage] | None:
    """The out-of-memory error in `exc` or its causes, with its parsed message."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        if isinstance(current, (RuntimeError, MemoryError)):
            msg = parse_message(str(current))
            if msg is None and type(current).__name__ == "OutOfMemoryError":
                msg = OomMessage("cuda", text=str(current)[:500])
            if msg is not None:
                return current, msg
        current = current.__cause__ or current.__context__
    return None


# -- where it failed: torchdoctor.failure (shared with the crash diagnosis) --------------------
def frame_names(
    frames: list[types.FrameType], training: TrainingView | None, torch: Any
) -> dict[int, str]:
    """id(tensor) -> "x in encoder.1.forward" for the tensors the failing frames hold."""
    names: dict[int, str] = {}
    for frame in reversed(frames):
        owner = first_arg(frame)
        where = frame.f_code.co_name
        if isinstance(owner, torch.nn.Module):
            where = f"{module_name(owner, training)}.{where}"
        for key, value in frame_locals(frame).items():
            try:
                if issubclass(type(value), torch.Tensor) and id(value) not in names:
                    names[id(value)] = f"{key} in {where}"
            except Exception:
                continue
    return names


# -- memory readings ------------------------------------------------------------------------
def cuda_memory(torch: Any, index: int, msg: OomMessage) -> dict[str, Any]:
    cuda = torch.cuda
    out: dict[str, Any] = {"device_index": index}
    try:
        stats = cuda.memory_stats(index)
        out["allocated"] = int(stats.get("allocated_bytes.all.current", 0))
        out["reserved"] = int(stats.get("reserved_bytes.all.current", 0))
        out["max_allocated"] = int(stats.get("allocated_bytes.all.peak", 0))
        out["inactive_split"] = int(stats.get("inactive_split_bytes.all.current", 0))
        out["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
        out["num_ooms"] = int(stats.get("num_ooms", 0))
    except Exception:
        pass
    total = msg.total
    try:
        total = int(cuda.get_device_properties(index).total_memory)
    except Exception:
        pass
    fraction = 1.0
    getter = getattr(cuda, "get_per_process_memory_fraction", None)
    if getter is not None:
        try:
            fraction = float(getter(index))
        except Exception:
            fraction = 1.0
    out["total"] = total
    out["fraction"] = fraction
    capacity = int(total * fraction) if total else None
    if msg.allowed:
        capacity = msg.allowed
    out["capacity"] = capacity
    # The allocator's own figures at the failure win over ours after it (same tensors alive).
    if msg.allocated is not None:
        out["allocated_at_failure"] = msg.allocated
    if msg.reserved is not None:
        out["reserved_at_failure"] = msg.reserved
    reserved = msg.reserved if msg.reserved is not None else out.get("reserved")
    free = msg.free
    if capacity is not None and reserved is not None:
        room = max(0, capacity - reserved)
        free = room if free is None else min(free, room)
    out["free"] = msg.free
    out["available"] = free
    try:
        out["devices"] = int(cuda.device_count())
    except Exception:
        out["devices"] = 1
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
    out["expandable_segments"] = "expandable_segments:true" in conf.replace(" ", "").lower()
    return out


# -- the capture -------------------------------------------------------------------------------
Query = Callable[[str], tuple[list[str], list[Any]]]  # SQL -> (columns, rows)


def _batch_size(training: TrainingView, torch: Any) -> int | None:
    for _module, args, kwargs in training.model_inputs():
        for value in [*args, *kwargs.values()]:
            try:
                if issubclass(type(value), torch.Tensor) and value.dim() >= 1:
                    return int(value.shape[0])
            except Exception:
                continue
    return None


def capture(
    exc: BaseException,
    msg: OomMessage,
    training: TrainingView | None,
    run_dir: str | None = None,
    query: Query | None = None,
) -> OomEvidence:
    """Every number of an out-of-memory failure (while the failed step's tensors live)."""
    import torch

    frames = frames_of(exc)
    where = locate(frames, training, torch)
    phase = phase_of(frames, torch)
    if phase is None:
        phase = training.phase if training is not None else None
        if phase in (None, "other"):
            started = training is not None and (training.steps_done or training.model_inputs())
            phase = "other" if started else "setup"
    step = training.step if training is not None else None

    models: list[tuple[Any, str]] = []
    optimizers: list[Any] = []
    if training is not None:
        try:
            models = list(training.models.models())
        except Exception:
            models = []
        if training.primary is not None:
            optimizers.append(training.primary)
    main = sys.modules.get("__main__")
    census = take_census(
        models,
        optimizers,
        namespace=dict(vars(main)) if main is not None else {},
        names=frame_names(frames, training, torch),
        saved=True,
    )
    del frames

    if msg.device == "cuda" and torch.cuda.is_available():
        index = msg.gpu if msg.gpu is not None else torch.cuda.current_device()
        device = f"cuda:{index}"
        mem = cuda_memory(torch, index, msg)
        allocated = mem.get("allocated_at_failure", mem.get("allocated"))
        reserved = mem.get("reserved_at_failure", mem.get("reserved"))
        cached = (reserved - allocated) if reserved is not None and allocated is not None else None
    else:
        device = msg.device
        mem = host_memory() if msg.device == "cpu" else {}
        allocated = mem.get("rss")
        cached = None

    by_kind = census.bytes_by_kind(device)
    breakdown = Breakdown(
        parameters=by_kind["parameter"],
        gradients=by_kind["gradient"],
        optimizer_state=by_kind["optimizer_state"],
        buffers=by_kind["buffer"],
        activations=by_kind["activation"],
        other=by_kind["other"],
        cached_unused=cached,
    )
    tensor_total = census.total(device)
    primary_model = models[0][0] if models else None
    if primary_model is None:
        for module, _label in _script_models(torch):
            primary_model = module
            break
    trainable = 0
    if primary_model is not None:
        try:
            for p in primary_model.parameters():
                if p.requires_grad and _on_device(p, device):
                    trainable += local_nbytes(p)  # a sharded model: this rank's shard
        except Exception:
            pass
    holders = _holders(training)
    graph_held = [h for h in holders if h.with_grad_fn]
    primary_opt = optimizers[0] if optimizers else None
    situation = Situation(
        device="cuda" if device.startswith("cuda") else "cpu",
        asked=msg.asked,
        capacity=mem.get("capacity"),
        available=mem.get("available"),
        phase=phase or "other",
        batch_size=_batch_size(training, torch) if training is not None else None,
        activation_dtypes=census.bytes_by_dtype("activation", device),
        optimizer=type(primary_opt).__name__
        if primary_opt is not None
        else (census.optimizers[0] if census.optimizers else None),
        trainable_bytes=trainable,
        layers=repeated_blocks(primary_model) if primary_model is not None else None,
        expandable_segments=bool(mem.get("expandable_segments", False)),
        devices=int(mem.get("devices", 1)),
        held_by_globals=sum(h.graph_bytes for h in graph_held),
        holder=graph_held[0].holder if graph_held else None,
        location=where["module"] or _file_line(where),
        activation_tensors=census.count_by_kind(device)["activation"],
        float32_parameters=census.bytes_by_dtype("parameter", device).get("float32", 0),
        largest_activation=max(
            (r.bytes for r in census.largest(1000, device) if r.kind == "activation"), default=0
        ),
    )
    sharding = _sharding(census, device)
    if sharding is not None:
        situation.world = sharding.world
        if sharding.units:
            largest = sharding.units[0]
            situation.all_gather = largest.unsharded
            situation.all_gather_unit = largest.name
            situation.gathered = sum(u.gathered for u in sharding.units)
    traced = _phases(query)
    return OomEvidence(
        exception=type(exc).__name__,
        message=msg.text,
        device=device,
        breakdown=breakdown,
        situation=situation,
        asked=msg.asked,
        step=step,
        phase=phase,
        module=where["module"],
        module_type=where["module_type"],
        location_source=where["source"],
        location_note=where["note"],
        file=where["file"],
        line=where["line"],
        function=where.get("function"),
        candidates=where.get("candidates"),
        message_fields=msg.as_dict(),
        memory=mem,
        counts=census.count_by_kind(device),
        tensor_bytes=tensor_total,
        # CUDA: allocator bytes the census found no tensor for (freed-later, C++-held);
        # CPU: the rest of the process (Python, libraries, allocator caches).
        not_in_tensors=max(0, int(allocated) - tensor_total) if allocated is not None else None,
        top_tensors=[r.as_dict() for r in census.largest(10, device)],
        optimizers=census.optimizers,
        models=[list(m) for m in census.models],
        holders=holders,
        phases=traced.get("phases", []),
        modules=traced.get("modules", []),
        traced_step=traced.get("traced_step"),
        snapshot=_snapshot(run_dir) if device.startswith("cuda") else None,
        run_dir=run_dir,
        sharding=sharding,
    )


def _sharding(census: Census, device: str) -> Sharding | None:
    """A sharded model's figures for the report; None when nothing is sharded."""
    world = census.sharded_world()
    if world <= 1 and not census.units:
        return None
    return Sharding(world=world, total=census.total_by_kind(device), units=list(census.units))


def _file_line(where: dict[str, Any]) -> str | None:
    if where.get("file") is None:
        return None
    return f"{where['file']}:{where['line']}"


def _on_device(t: Any, device: str) -> bool:
    d = str(t.device)
    return d == device or (":" not in device and d.split(":")[0] == device)


def _script_models(torch: Any) -> list[tuple[Any, str]]:
    main = sys.modules.get("__main__")
    out = []
    for key, value in list(vars(main).items()) if main is not None else []:
        if isinstance(value, torch.nn.Module) and not key.startswith("_"):
            out.append((value, key))
    return out


def _holders(training: TrainingView | None) -> list[Holder]:
    try:
        return find_holders(training, limit=3)
    except Exception:
        return []


def _phases(query: Query | None) -> dict[str, Any]:
    if query is None:
        return {}
    try:
        return from_engine(query)
    except Exception:
        return {}


def _snapshot(run_dir: str | None) -> str | None:
    try:
        path = dump_snapshot(Path(run_dir) if run_dir else None)
    except Exception:
        return None
    return str(path) if path is not None else None


__all__ = ["OomMessage", "capture", "find_oom", "human", "parse_message"]
