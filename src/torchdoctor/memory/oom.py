"""Out-of-memory capture: when an allocation fails, gather the numbers before the process dies.

`find_oom(exc)` recognises an out-of-memory error in the exception that ended the script (CUDA
`torch.OutOfMemoryError`, "CUDA out of memory", CPU "DefaultCPUAllocator: can't allocate
memory", ...) and reads its message's fields. `capture` runs while the traceback still holds
every frame, so the tensors of the failed step are still alive: it finds the step, the phase and
the module that asked, takes the tensor census, reads the allocator or the host memory, and
returns the OomEvidence that torchdoctor.diagnose.oom turns into the diagnosis.
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchdoctor.failure import first_arg, frame_locals, frames_of, locate, module_name, phase_of
from torchdoctor.memory.census import take_census
from torchdoctor.memory.cuda_history import dump_snapshot
from torchdoctor.memory.estimate import Breakdown, Situation, repeated_blocks
from torchdoctor.memory.evidence import OomEvidence
from torchdoctor.memory.holders import find_holders
from torchdoctor.memory.phases import from_engine
from torchdoctor.units import human, size_in
from torchdoctor.views import TrainingView

_SIZE = r"\d+(?:\.\d+)?\s*(?:[KMGT]i?B|bytes?)"
_CPU = re.compile(
    r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)"
    r"(?:: you tried to allocate (\d+) bytes)?"
)
_NUMPY = re.compile(rf"Unable to allocate ({_SIZE}) for an array")
_NEW = re.compile(
    rf"Tried to allocate ({_SIZE})\. (?:GPU|Device) (\d+) has a total capacity of ({_SIZE}) "
    rf"of which ({_SIZE}) is free\."
)
_OLD = re.compile(
    rf"Tried to allocate ({_SIZE}) \(GPU (\d+); ({_SIZE}) total capacity; "
    rf"({_SIZE}) already allocated; ({_SIZE}) free;"
)
_OLD_ALLOWED = re.compile(rf"({_SIZE}) allowed;")
_OLD_RESERVED = re.compile(rf"({_SIZE}) reserved in total by PyTorch")
_PROCESS = re.compile(rf"this process has ({_SIZE}) memory in use")
_BY_TORCH = re.compile(rf"Of the allocated memory ({_SIZE}) is allocated by PyTorch")
_PRIVATE = re.compile(rf"with ({_SIZE}) allocated in private pools")
_UNALLOCATED = re.compile(rf"({_SIZE}) is reserved by PyTorch but unallocated")
_MPS = re.compile(rf"max allowed: ({_SIZE})\)")


@dataclasses.dataclass
class OomMessage:
    device: str  # "cuda", "cpu", "xpu" or "mps"
    asked: int | None = None
    gpu: int | None = None
    total: int | None = None  # device capacity
    free: int | None = None  # free on the device (CUDA API) when it failed
    allocated: int | None = None  # by PyTorch's allocator
    reserved: int | None = None  # by PyTorch's allocator in total
    allowed: int | None = None  # the per-process cap, when the message gives it
    process: int | None = None  # this process, non-PyTorch memory included
    text: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _sz(rx: re.Pattern[str], text: str, group: int = 1) -> int | None:
    m = rx.search(text)
    return size_in(m.group(group)) if m else None


def parse_message(text: str) -> OomMessage | None:
    """The fields of an out-of-memory message (every PyTorch wording we know), or None."""
    first = text.strip().splitlines()[0][:500] if text.strip() else ""
    m = _CPU.search(text)
    if m:
        return OomMessage("cpu", asked=int(m.group(1)) if m.group(1) else None, text=first)
    m = _NUMPY.search(text)
    if m:
        return OomMessage("cpu", asked=size_in(m.group(1)), text=first)
    gpu_kind = None
    for marker, kind in (("CUDA out of memory", "cuda"), ("XPU out of memory", "xpu")):
        if marker in text:
            gpu_kind = kind
    if gpu_kind is None and "CUDA error: out of memory" in text:
        return OomMessage("cuda", text=first)
    if gpu_kind is not None:
        msg = OomMessage(gpu_kind, text=first)
        new = _NEW.search(text)
        old = _OLD.search(text)
        if new:
            msg.asked, msg.gpu = size_in(new.group(1)), int(new.group(2))
            msg.total, msg.free = size_in(new.group(3)), size_in(new.group(4))
            by_torch = _sz(_BY_TORCH, text)
            private = _sz(_PRIVATE, text) or 0
            unallocated = _sz(_UNALLOCATED, text)
            msg.allocated = by_torch
            if by_torch is not None and unallocated is not None:
                msg.reserved = by_torch + private + unallocated
            msg.process = _sz(_PROCESS, text)
            msg.allowed = _sz(_OLD_ALLOWED, text)
        elif old:
            msg.asked, msg.gpu = size_in(old.group(1)), int(old.group(2))
            msg.total, msg.allocated = size_in(old.group(3)), size_in(old.group(4))
            msg.free = size_in(old.group(5))
            msg.allowed = _sz(_OLD_ALLOWED, text)
            msg.reserved = _sz(_OLD_RESERVED, text)
        else:
            msg.asked = _sz(re.compile(rf"Tried to allocate ({_SIZE})"), text)
        return msg
    if "MPS backend out of memory" in text:
        return OomMessage(
            "mps",
            asked=_sz(re.compile(rf"Tried to allocate ({_SIZE})"), text),
            allowed=_sz(_MPS, text),
            text=first,
        )
    return None


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
def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _status() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if key.startswith("Vm") and parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _cgroup_room() -> tuple[int | None, int | None]:
    """(limit, room left) of the cgroup v2 memory limit, when there is one."""
    try:
        limit_text = open("/sys/fs/cgroup/memory.max").read().strip()  # noqa: SIM115
        current = int(open("/sys/fs/cgroup/memory.current").read().strip())  # noqa: SIM115
    except (OSError, ValueError):
        return None, None
    if not limit_text.isdigit():
        return None, None
    return int(limit_text), max(0, int(limit_text) - current)


def host_memory() -> dict[str, Any]:
    """What this process may still take from the host: RAM, address-space limit, cgroup."""
    info = _meminfo()
    status = _status()
    rss = status.get("VmRSS", 0)
    rooms: dict[str, int] = {}
    if "MemAvailable" in info:
        rooms["ram"] = info["MemAvailable"]
    limit = None
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            limit = int(soft)
            rooms["address_space_limit"] = max(0, limit - status.get("VmSize", 0))
    except (OSError, ValueError):
        pass
    cg_limit, cg_room = _cgroup_room()
    if cg_room is not None:
        rooms["cgroup"] = cg_room
    available = min(rooms.values()) if rooms else None
    return {
        "total": info.get("MemTotal"),
        "available": available,
        "limited_by": min(rooms, key=lambda k: rooms[k]) if rooms else None,
        "rss": rss,
        "vm_size": status.get("VmSize"),
        "rlimit_as": limit,
        "cgroup_limit": cg_limit,
        "capacity": (rss + available) if available is not None else info.get("MemTotal"),
    }


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
                    trainable += p.numel() * p.element_size()
        except Exception:
            pass
    holders = _holders(training)
    graph_held = [h for h in holders if h.get("with_grad_fn")]
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
        held_by_globals=sum(int(h.get("graph_bytes", 0)) for h in graph_held),
        holder=graph_held[0]["holder"] if graph_held else None,
        location=where["module"] or _file_line(where),
        activation_tensors=census.count_by_kind(device)["activation"],
        float32_parameters=census.bytes_by_dtype("parameter", device).get("float32", 0),
        largest_activation=max(
            (r.bytes for r in census.largest(1000, device) if r.kind == "activation"), default=0
        ),
    )
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
    )


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


def _holders(training: TrainingView | None) -> list[dict[str, Any]]:
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
