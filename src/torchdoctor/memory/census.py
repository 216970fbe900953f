"""The tensor census: every live tensor of the process, what it is, and the bytes it holds.

Where tensors are found:
  parameters, buffers  the watched models, every nn.Module named in __main__, and the outermost
                       modules among all live modules (named as `model.named_parameters()` names
                       them; models after the first get their label as a prefix)
  gradients            `p.grad` of every parameter
  optimizer_state      `optimizer.state` of every live optimizer ("exp_avg of encoder.0.weight")
  activation           tensors with a `grad_fn` (their graph is alive) and the tensors the
                       autograd graphs reachable from them saved for backward
  other                every other tensor the garbage collector knows (inputs, detached copies)

A DTensor (FSDP2's sharded parameters, gradients and optimizer state; tensor-parallel weights)
is counted by this rank's local shard: its row owns the local shard's bytes and says what the
whole tensor takes (`total_bytes`), over how many ranks (`world`) and how (`placements`), all
read from the DTensor's metadata, never by a collective. A parameter that an FSDP2 unit
(a module given to `fully_shard`) manages carries that unit's name (`unit`): the unit
all-gathers its parameters whole for its forward and backward (`Census.units`).

Storage shared by several tensors is counted once: each tensor owns the bytes of its storage
that no earlier tensor covered, in the order above, and what no tensor covers (a small view
keeping a large storage alive) goes to the first tensor of that storage. So parameters own
exactly their own bytes, and a view of a parameter owns 0.

The census runs only when asked (a query of python.tensors, an out-of-memory crash); it reads
and never changes anything, and an object it cannot read is skipped.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from torchdoctor.sharding import dtensor_class, fsdp_module_class
from torchdoctor.views import TrainingView, indexed

KINDS = ("parameter", "gradient", "optimizer_state", "buffer", "activation", "other")
GRAPH_NODE_LIMIT = 200_000  # autograd nodes visited when looking for saved tensors


@dataclasses.dataclass
class TensorRecord:
    kind: str
    name: str | None
    shape: tuple[int, ...]
    dtype: str
    device: str
    bytes: int
    requires_grad: bool
    grad_fn: str | None
    # Sharded tensors (DTensor): `shape` is the whole tensor's, `bytes` this rank's shard.
    total_bytes: int | None = None  # the whole tensor over all ranks; None: not sharded
    world: int | None = None  # ranks of the DTensor's device mesh
    placements: str | None = None  # "Shard(dim=0)", "Replicate()"
    unit: str | None = None  # the FSDP2 unit that all-gathers this parameter

    @property
    def gathered(self) -> bool:
        """An FSDP2 unit's parameter held whole now (all-gathered): held on top of its shard,
        which stays alive as a DTensor of its own."""
        return self.unit is not None and self.world is None

    def whole(self) -> int:
        """Bytes this tensor takes over all ranks (0 for an all-gathered copy: its shard's
        DTensor counts the whole)."""
        if self.gathered:
            return 0
        return self.bytes if self.total_bytes is None else self.total_bytes

    def row(self) -> tuple[Any, ...]:
        """The python.tensors row."""
        return (
            self.kind,
            self.name,
            str(self.shape),
            self.dtype,
            self.device,
            self.bytes,
            self.requires_grad,
            self.grad_fn,
            self.total_bytes,
            self.world,
            self.placements,
            self.unit,
        )

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["shape"] = list(self.shape)
        return out


@dataclasses.dataclass
class Unit:
    """An FSDP2 unit: the parameters one all-gather materialises whole."""

    name: str
    unsharded: int  # bytes of its parameters whole: what its all-gather materialises
    parameters: int
    gathered: int  # bytes of them held whole now (the unit was unsharded at the census)


@dataclasses.dataclass(kw_only=True)
class Sharding:
    """A sharded model's figures: the ranks its tensors span, each kind's bytes whole over all
    ranks, and the FSDP2 units, largest first (what each all-gather materialises)."""

    world: int
    total: dict[str, int]  # kind -> bytes
    units: list[Unit]


@dataclasses.dataclass
class Census:
    records: list[TensorRecord]
    optimizers: list[str]  # class names of the optimizers found
    models: list[tuple[str, str]]  # (label, class name) of the models named
    units: list[Unit] = dataclasses.field(default_factory=list)  # FSDP2 units, largest first

    def sharded_world(self) -> int:
        """Ranks the sharded tensors are spread over (1: nothing sharded)."""
        return max((r.world or 1 for r in self.records), default=1)

    def total_by_kind(self, device: str | None = None) -> dict[str, int]:
        """Bytes per kind of the whole tensors, over every rank (a plain tensor: its bytes)."""
        out = dict.fromkeys(KINDS, 0)
        for r in self.records:
            if _on(r.device, device):
                out[r.kind] += r.whole()
        return out

    def largest_unit(self) -> Unit | None:
        """The FSDP2 unit whose all-gather materialises most: a rank's peak above its shards."""
        return self.units[0] if self.units else None

    def bytes_by_kind(self, device: str | None = None) -> dict[str, int]:
        """Bytes per kind; `device` "cuda:0", "cuda" (any GPU) or "cpu" filters."""
        out = dict.fromkeys(KINDS, 0)
        for r in self.records:
            if _on(r.device, device):
                out[r.kind] += r.bytes
        return out

    def count_by_kind(self, device: str | None = None) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for r in self.records:
            if _on(r.device, device):
                out[r.kind] += 1
        return out

    def bytes_by_dtype(self, kind: str, device: str | None = None) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            if r.kind == kind and _on(r.device, device):
                out[r.dtype] = out.get(r.dtype, 0) + r.bytes
        return out

    def largest(self, n: int = 10, device: str | None = None) -> list[TensorRecord]:
        chosen = [r for r in self.records if _on(r.device, device) and r.bytes > 0]
        chosen.sort(key=lambda r: r.bytes, reverse=True)
        return chosen[:n]

    def total(self, device: str | None = None) -> int:
        return sum(r.bytes for r in self.records if _on(r.device, device))


def _on(tensor_device: str, wanted: str | None) -> bool:
    if wanted is None or tensor_device == wanted:
        return True
    return ":" not in wanted and tensor_device.split(":")[0] == wanted


class _Storages:
    """Which bytes of which storage are already owned by a recorded tensor."""

    def __init__(self) -> None:
        self.covered: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self.size: dict[tuple[str, int], int] = {}
        self.first: dict[tuple[str, int], TensorRecord] = {}

    def claim(self, tensor: Any, record: TensorRecord) -> int:
        """Bytes of `tensor`'s storage that no earlier tensor covered; -1 when unreadable."""
        place = _storage_span(tensor)
        if place is None:
            return -1
        key, start, end, nbytes = place
        if key not in self.size:
            self.size[key] = nbytes
            self.first[key] = record
            self.covered[key] = []
        spans = self.covered[key]
        new = _uncovered(spans, start, end)
        if end > start:
            spans.append((start, end))
        return new

    def settle(self) -> None:
        """Bytes of each storage that no tensor covers go to its first tensor."""
        for key, nbytes in self.size.items():
            covered = _union_length(self.covered[key])
            if nbytes > covered:
                self.first[key].bytes += nbytes - covered


def _uncovered(spans: list[tuple[int, int]], start: int, end: int) -> int:
    if end <= start:
        return 0
    pieces = [(max(s, start), min(e, end)) for s, e in spans if s < end and e > start]
    return (end - start) - _union_length(pieces)


def _union_length(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for s, e in sorted(spans):
        if reach is None or s > reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


def _storage_span(t: Any) -> tuple[tuple[str, int], int, int, int] | None:
    """((device, storage address), first byte, end byte, storage bytes) of a dense tensor."""
    try:
        if t.device.type == "meta":
            return None
        storage = t.untyped_storage()
        nbytes = int(storage.nbytes())
        ptr = int(storage.data_ptr())
        size = t.element_size()
        numel = t.numel()
        start = int(t.storage_offset()) * size
        if numel == 0:
            end = start
        else:
            reach = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
            end = start + (reach + 1) * size
        if ptr == 0 and nbytes == 0:
            return None
        return (str(t.device), ptr), start, min(end, max(nbytes, start)), nbytes
    except Exception:
        return None


def _nbytes(t: Any) -> int:
    """Bytes of the whole tensor (a DTensor: its global shape's, from metadata); 0 unknown."""
    try:
        return int(t.numel()) * int(t.element_size())
    except Exception:
        return 0


def local_nbytes(t: Any) -> int:
    """Bytes of what this rank holds of a tensor: a DTensor's local shard, else the tensor."""
    dtensor = dtensor_class()
    if dtensor is not None and isinstance(t, dtensor):
        t = getattr(t, "_local_tensor", None)
    return _nbytes(t) if t is not None else 0


def _fallback_bytes(t: Any) -> int:
    """A tensor without a plain storage (sparse, nested): its values' bytes, not shared."""
    try:
        if t.device.type == "meta":
            return 0
        if t.is_sparse:
            return int(t._values().nbytes + t._indices().nbytes)
        if getattr(t, "is_nested", False):
            return int(t.values().nbytes) if hasattr(t, "values") else 0
    except Exception:
        return 0
    return 0


def _describe(t: Any) -> tuple[tuple[int, ...], str, str, bool, str | None] | None:
    try:
        shape = tuple(int(n) for n in t.shape)
    except Exception:
        shape = ()
    try:
        dtype = str(t.dtype).removeprefix("torch.")
        device = str(t.device)
        requires_grad = bool(t.requires_grad)
        fn = t.grad_fn
        grad_fn = type(fn).__name__ if fn is not None else None
    except Exception:
        return None
    return shape, dtype, device, requires_grad, grad_fn


class _Builder:
    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.records: list[TensorRecord] = []
        self.seen: set[int] = set()
        self.keep: list[Any] = []  # holds every tensor recorded, so ids stay unique
        self.storages = _Storages()

        self.dtensor = dtensor_class()  # None until torch.distributed.tensor is imported

    def add(
        self, t: Any, kind: str, name: str | None, drop_empty: bool = False
    ) -> TensorRecord | None:
        if id(t) in self.seen:
            return None
        self.seen.add(id(t))
        self.keep.append(t)
        described = _describe(t)
        if described is None:
            return None
        shape, dtype, device, requires_grad, grad_fn = described
        record = TensorRecord(kind, name, shape, dtype, device, 0, requires_grad, grad_fn)
        held = t
        if self.dtensor is not None and isinstance(t, self.dtensor):
            held = _shard_facts(t, record)
            if held is None:
                return None
            self.seen.add(id(held))  # the local shard is this row, not an "other" of its own
            self.keep.append(held)
        owned = self.storages.claim(held, record)
        record.bytes = owned if owned >= 0 else _fallback_bytes(held)
        if drop_empty and record.bytes == 0:
            return None
        self.records.append(record)
        return record


def _shard_facts(t: Any, record: TensorRecord) -> Any:
    """Fill a DTensor's sharding facts into its record, and return its local shard: all from
    metadata (the mesh's size, the placements, the global shape), no collective."""
    try:
        held = t._local_tensor
        record.total_bytes = _nbytes(t)
        record.world = int(t.device_mesh.size())
        record.placements = ", ".join(repr(p) for p in t.placements)
    except Exception:
        return None
    return held


def take_census(
    models: Iterable[tuple[Any, str]] = (),
    optimizers: Iterable[Any] = (),
    *,
    namespace: Mapping[str, Any] | None = None,
    names: Mapping[int, str] | None = None,
    saved: bool = True,
    scan: bool = True,
) -> Census:
    """Classify every live tensor (see the module docstring).

    models: (module, label) pairs named first (the first one's names get no prefix);
    optimizers: optimizers besides those found alive; namespace: a module's globals whose
    nn.Modules are models too and whose tensors are named by their variable; names: id(tensor)
    -> name for tensors the caller knows (locals of the frames of a crash); saved: also walk the
    autograd graphs for the tensors they saved; scan: look at every object the garbage
    collector tracks (off: only what was passed in)."""
    import torch

    b = _Builder(torch)
    module_cls, optim_cls, param_cls = torch.nn.Module, torch.optim.Optimizer, torch.nn.Parameter
    tensors: list[Any] = []
    live_modules: list[Any] = []
    live_optims: list[Any] = []
    if scan:
        for obj in gc.get_objects():
            try:
                tp = type(obj)
                if issubclass(tp, torch.Tensor):
                    tensors.append(obj)
                elif issubclass(tp, module_cls):
                    live_modules.append(obj)
                elif issubclass(tp, optim_cls):
                    live_optims.append(obj)
            except Exception:
                continue
    given_names = dict(names or {})
    ns = dict(namespace or {})
    for key, value in ns.items():
        try:
            if issubclass(type(value), torch.Tensor) and id(value) not in given_names:
                given_names[id(value)] = key
                base = value._base  # a view keeps its base tensor alive
                if base is not None and id(base) not in given_names:
                    given_names[id(base)] = f"base of {key}"
        except Exception:
            continue

    # Models: the given ones, the script's named ones, then the outermost of the rest.
    named = _models(list(models), ns, live_modules, module_cls)
    param_names: dict[int, str] = {}
    params: list[tuple[Any, str]] = []
    for index, (module, label) in enumerate(named):
        prefix = "" if index == 0 and not indexed(module) else f"{label}."
        try:
            for pname, p in module.named_parameters():
                if id(p) not in param_names:
                    param_names[id(p)] = prefix + pname
                    params.append((p, prefix + pname))
        except Exception:
            continue
    named_params = set(param_names)
    for t in tensors:  # parameters outside any module: `w = nn.Parameter(...)`
        if isinstance(t, param_cls) and id(t) not in param_names:
            name = given_names.get(id(t))
            param_names[id(t)] = name or f"parameter {len(params)}"
            params.append((t, name or ""))
    units = _fsdp_units(named)
    for p, pname in params:
        # A parameter outside every module that owns nothing (FSDP2's unsharded parameter
        # between all-gathers: its storage is freed) is left out.
        record = b.add(p, "parameter", pname or None, drop_empty=id(p) not in named_params)
        unit = units.get(id(p))
        if record is not None and unit is not None:
            record.unit = unit
            if record.total_bytes is None:  # held whole now: all-gathered
                record.total_bytes = _nbytes(p)
    for p, pname in params:
        grad = getattr(p, "grad", None) if _safe_is_tensor(p, torch) else None
        if grad is not None:
            b.add(grad, "gradient", pname or None)

    # Optimizer state.
    found_optims: list[Any] = []
    for opt in [*optimizers, *live_optims]:
        if opt is not None and all(opt is not o for o in found_optims):
            found_optims.append(opt)
    for opt in found_optims:
        try:
            items = list(opt.state.items())
        except Exception:
            continue
        for i, (p, state) in enumerate(items):
            pname = param_names.get(id(p), f"param {i}")
            if not isinstance(state, Mapping):
                continue
            for key, value in list(state.items()):
                if _safe_is_tensor(value, torch):
                    b.add(value, "optimizer_state", f"{key} of {pname}")
                elif isinstance(value, (list, tuple)):
                    for j, item in enumerate(value):
                        if _safe_is_tensor(item, torch):
                            b.add(item, "optimizer_state", f"{key}[{j}] of {pname}")

    # Buffers.
    for index, (module, label) in enumerate(named):
        prefix = "" if index == 0 and not indexed(module) else f"{label}."
        try:
            for bname, buf in module.named_buffers():
                b.add(buf, "buffer", prefix + bname)
        except Exception:
            continue

    # Everything else the garbage collector knows; graphs first reach their saved tensors.
    roots: list[Any] = []
    for t in tensors:
        if id(t) in b.seen:
            continue
        try:
            has_graph = t.grad_fn is not None
        except Exception:
            continue
        b.add(t, "activation" if has_graph else "other", given_names.get(id(t)))
        if has_graph:
            roots.append(t.grad_fn)
    if saved:
        _walk_saved(b, roots, torch)
    del tensors
    b.storages.settle()
    return Census(
        records=b.records,
        optimizers=[type(o).__name__ for o in found_optims],
        models=[(label, type(m).__name__) for m, label in named],
        units=_unit_sizes(b.records),
    )


def _fsdp_units(named: list[tuple[Any, str]]) -> dict[int, str]:
    """id(parameter) -> the FSDP2 unit that manages it: the innermost module under
    `fully_shard` above it (named like the parameters: the model's label for a root)."""
    fsdp = fsdp_module_class()
    out: dict[int, str] = {}
    if fsdp is None:
        return out
    for index, (module, label) in enumerate(named):
        prefix = "" if index == 0 and not indexed(module) else f"{label}."
        try:
            # Outer units first (named_modules walks top-down): an inner unit claims its own.
            for path, sub in module.named_modules():
                if isinstance(sub, fsdp):
                    unit = (prefix + path) if path else label
                    for p in sub.parameters():
                        out[id(p)] = unit
        except Exception:
            continue
    return out


def _unit_sizes(records: list[TensorRecord]) -> list[Unit]:
    """Each unit's parameters whole, and what of them is held whole now; the largest first."""
    units: dict[str, Unit] = {}
    for r in records:
        if r.kind != "parameter" or r.unit is None:
            continue
        unit = units.setdefault(r.unit, Unit(r.unit, 0, 0, 0))
        unit.unsharded += r.total_bytes or 0
        unit.parameters += 1
        if r.gathered:
            unit.gathered += r.total_bytes or 0
    return sorted(units.values(), key=lambda u: u.unsharded, reverse=True)


def _safe_is_tensor(value: Any, torch: Any) -> bool:
    try:
        return issubclass(type(value), torch.Tensor)
    except Exception:
        return False


def _models(
    given: list[tuple[Any, str]], ns: Mapping[str, Any], live: list[Any], module_cls: Any
) -> list[tuple[Any, str]]:
    out: list[tuple[Any, str]] = []
    covered: set[int] = set()
    labels: set[str] = set()

    def take(module: Any, label: str) -> None:
        if id(module) in covered:
            return
        base, n = label, 2
        while label in labels:
            label, n = f"{base}{n}", n + 1
        labels.add(label)
        out.append((module, label))
        try:
            for sub in module.modules():
                covered.add(id(sub))
        except Exception:
            covered.add(id(module))

    for module, label in given:
        take(module, label)
    for key, value in list(ns.items()):
        try:
            if isinstance(value, module_cls) and not key.startswith("_"):
                take(value, key)
        except Exception:
            continue
    rest = [m for m in live if id(m) not in covered]
    children: set[int] = set()
    for m in rest:
        try:
            children.update(id(c) for c in m.children())
        except Exception:
            continue
    for m in rest:
        if id(m) not in children:
            take(m, type(m).__name__)
    return out


def _walk_saved(b: _Builder, roots: list[Any], torch: Any) -> None:
    """Tensors that the autograd graphs reachable from `roots` saved for backward."""
    seen: set[int] = set()
    stack = list(roots)
    keep: list[Any] = []  # nodes stay referenced so ids stay unique during the walk
    while stack and len(seen) < GRAPH_NODE_LIMIT:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        keep.append(node)
        node_name = type(node).__name__
        attrs = saved_attributes(node)
        for attr in attrs:
            try:
                value = getattr(node, attr)
            except Exception:  # freed by a backward already, or not readable
                continue
            items = value if isinstance(value, (list, tuple)) else (value,)
            for item in items:
                if _safe_is_tensor(item, torch):
                    label = f"{attr.removeprefix('_saved_')} saved by {node_name}"
                    b.add(item, "activation", label, drop_empty=True)
        # Custom autograd Functions: ctx.save_for_backward(...) and tensors set on ctx.
        if hasattr(type(node), "_forward_cls"):
            try:
                for item in node.saved_tensors:
                    if _safe_is_tensor(item, torch):
                        b.add(item, "activation", f"saved by {node_name}", drop_empty=True)
            except Exception:
                pass
            try:
                for key, item in list(vars(node).items()):
                    if _safe_is_tensor(item, torch):
                        b.add(item, "activation", f"ctx.{key} of {node_name}", drop_empty=True)
            except Exception:
                pass
        try:
            for nxt, _index in node.next_functions:
                if nxt is not None and id(nxt) not in seen:
                    stack.append(nxt)
        except Exception:
            continue


_SAVED_ATTRS: dict[type, tuple[str, ...]] = {}


def saved_attributes(node: Any) -> tuple[str, ...]:
    """The `_saved_*` attributes of an autograd node's class (looked up once per class)."""
    kind = type(node)
    attrs = _SAVED_ATTRS.get(kind)
    if attrs is None:
        try:
            attrs = tuple(a for a in dir(kind) if a.startswith("_saved_"))
        except Exception:
            attrs = ()
        _SAVED_ATTRS[kind] = attrs
    return attrs


def census_rows(training: TrainingView | None) -> list[tuple[Any, ...]]:
    """python.tensors for the live process (computed at query time)."""
    census = live_census(training)
    return [r.row() for r in census.records] if census is not None else []


def live_census(
    training: TrainingView | None, names: Mapping[int, str] | None = None
) -> Census | None:
    """The census of this process; None before torch is imported."""
    if training is None and "torch" not in sys.modules:
        return None
    models: list[tuple[Any, str]] = []
    optimizers: list[Any] = []
    saved = True
    if training is not None:
        try:
            models = list(training.models.models())
        except Exception:
            models = []
        primary = training.primary
        if primary is not None:
            optimizers.append(primary)
        # Saved tensors are read only while no backward runs: a backward frees them.
        saved = training.phase != "backward"
    main = sys.modules.get("__main__")
    namespace = dict(vars(main)) if main is not None else {}
    return take_census(models, optimizers, namespace=namespace, names=names, saved=saved)
