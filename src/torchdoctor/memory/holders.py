"""Who keeps tensors alive from one step to the next, and what grew between two censuses.

`find_holders(training)` looks at the script's globals (`__main__`, and the modules imported
from the script's own directory), one level into plain objects and models (`trainer.history`,
`model.cache`), for lists, tuples, dicts, deques and sets holding tensors; the classic leak is
`losses.append(loss)`, where each loss keeps its whole autograd graph alive. It only reads,
and is safe to call from a background thread while the training runs (the saved tensors of
graphs are read only while no backward runs: a backward frees them).

`census_diff(before, after)` compares two censuses by kind and name (unnamed tensors by
dtype, shape and grad_fn) and tells what grew.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import types
from collections.abc import Iterable
from typing import Any

from torchdoctor.memory.census import saved_attributes
from torchdoctor.views import TrainingView

ITEM_LIMIT = 100_000  # items looked at per holder
DEPTH_LIMIT = 3  # nesting of containers inside a holder
GRAPH_ROOTS_LIMIT = 2_000  # graphs walked per holder for their saved tensors
_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)


def _script_namespaces() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    main = sys.modules.get("__main__")
    if main is None:
        return out
    out.append(("__main__", dict(vars(main))))
    main_file = getattr(main, "__file__", None)
    if not main_file:
        return out
    home = os.path.dirname(os.path.abspath(main_file)) + os.sep
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if (
            module is main
            or not path
            or not os.path.abspath(path).startswith(home)
            or "site-packages" in path
        ):
            continue
        try:
            out.append((name, dict(vars(module))))
        except Exception:
            continue
    return out


def _candidates(torch: Any) -> Iterable[tuple[str, Any]]:
    """(dotted name, container) for every container a script global reaches in one step."""
    module_cls, optim_cls = torch.nn.Module, torch.optim.Optimizer
    for prefix, namespace in _script_namespaces():
        for key, value in namespace.items():
            if key.startswith("__"):
                continue
            if isinstance(value, _CONTAINERS):
                yield f"{prefix}.{key}", value
                continue
            if isinstance(value, (types.ModuleType, type, types.FunctionType)):
                continue
            if issubclass(type(value), torch.Tensor) or isinstance(value, optim_cls):
                continue  # an optimizer's state is meant to stay (the census counts it)
            try:
                attrs = vars(value)
            except TypeError:
                continue
            is_module = isinstance(value, module_cls)
            for attr, inner in list(attrs.items()):
                if is_module and attr.startswith("_"):
                    continue  # the module's own parameters, buffers, submodules, hooks
                if isinstance(inner, _CONTAINERS):
                    yield f"{prefix}.{key}.{attr}", inner


def _tensors_in(value: Any, torch: Any) -> list[Any]:
    out: list[Any] = []
    stack: list[tuple[Any, int]] = [(value, 0)]
    looked = 0
    while stack and looked < ITEM_LIMIT:
        item, depth = stack.pop()
        looked += 1
        try:
            if issubclass(type(item), torch.Tensor):
                out.append(item)
                continue
            if depth >= DEPTH_LIMIT or not isinstance(item, _CONTAINERS):
                continue
            children = list(item.values()) if isinstance(item, dict) else list(item)
        except Exception:  # changed while we looked: skip it
            continue
        stack.extend((child, depth + 1) for child in children)
    return out


def describe(t: Any) -> str:
    """`tensor(shape=(), grad_fn=NllLossBackward0)`."""
    try:
        shape = tuple(int(n) for n in t.shape)
        fn = t.grad_fn
        extra = f", grad_fn={type(fn).__name__}" if fn is not None else f", dtype={t.dtype}"
        return f"tensor(shape={shape}{extra})"
    except Exception:
        return "tensor(?)"


def _storage_key(t: Any) -> tuple[str, int, int] | None:
    try:
        storage = t.untyped_storage()
        return (str(t.device), int(storage.data_ptr()), int(storage.nbytes()))
    except Exception:
        return None


def _graph_bytes(roots: list[Any], exclude: set[tuple[str, int]], torch: Any) -> int:
    """Bytes of the tensors the graphs of `roots` saved for backward (parameters excluded)."""
    seen_nodes: set[int] = set()
    keep: list[Any] = []
    storages: dict[tuple[str, int], int] = {}
    stack = list(roots)
    while stack and len(seen_nodes) < 200_000:
        node = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        keep.append(node)
        for attr in saved_attributes(node):
            try:
                value = getattr(node, attr)
            except Exception:
                continue
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if issubclass(type(item), torch.Tensor):
                    key = _storage_key(item)
                    if key is not None and key[:2] not in exclude:
                        storages[key[:2]] = key[2]
        try:
            stack.extend(n for n, _i in node.next_functions if n is not None)
        except Exception:
            continue
    return sum(storages.values())


def _parameter_storages(training: TrainingView | None) -> set[tuple[str, int]]:
    out: set[tuple[str, int]] = set()
    try:
        models = [m for m, _label in training.models.models()] if training is not None else []
    except Exception:
        models = []
    for model in models:
        try:
            for p in model.parameters():
                key = _storage_key(p)
                if key is not None:
                    out.add(key[:2])
        except Exception:
            continue
    return out


@dataclasses.dataclass(kw_only=True)
class Holder:
    """A container reachable from the script's globals that holds tensors: its name
    (`__main__.losses`), type, how many tensors and how many of them carry a grad_fn, the
    bytes of their own storage and of what their autograd graphs saved for backward
    (parameters excluded: what a kept loss really costs), and one of them described."""

    holder: str
    type: str
    tensors: int
    with_grad_fn: int
    bytes: int
    graph_bytes: int
    example: str


def find_holders(training: TrainingView | None, limit: int = 5) -> list[Holder]:
    """The containers that hold tensors, the biggest first (those whose tensors keep graphs
    alive before the others)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    walk_graphs = training is None or training.phase != "backward"
    params = _parameter_storages(training) if walk_graphs else set()
    found: list[Holder] = []
    seen: set[int] = set()
    for name, container in _candidates(torch):
        if id(container) in seen:
            continue
        seen.add(id(container))
        tensors = _tensors_in(container, torch)
        if not tensors:
            continue
        with_fn = []
        storages: dict[tuple[str, int], int] = {}
        for t in tensors:
            try:
                if t.grad_fn is not None:
                    with_fn.append(t)
            except Exception:
                continue
            key = _storage_key(t)
            if key is not None:
                storages[key[:2]] = key[2]
        if not with_fn and len(tensors) < 8:
            continue
        graph = 0
        if with_fn and walk_graphs:
            roots = [t.grad_fn for t in with_fn[:GRAPH_ROOTS_LIMIT]]
            graph = _graph_bytes(roots, params | set(storages), torch)
        example = with_fn[0] if with_fn else tensors[0]
        found.append(
            Holder(
                holder=name,
                type=type(container).__name__,
                tensors=len(tensors),
                with_grad_fn=len(with_fn),
                bytes=sum(storages.values()),
                graph_bytes=graph,
                example=describe(example),
            )
        )
    found.sort(key=lambda h: (h.with_grad_fn > 0, h.bytes + h.graph_bytes), reverse=True)
    return found[: max(0, limit)]


# -- census difference ---------------------------------------------------------------------
def _key(record: Any) -> tuple[str, str]:
    kind, name = record.kind, record.name
    if name:
        return kind, name
    fn = f" {record.grad_fn}" if record.grad_fn else ""
    return kind, f"<{record.dtype} {list(record.shape)}{fn}>"


def _records(census: Any) -> list[Any]:
    return list(getattr(census, "records", census))


def census_diff(before: Any, after: Any, limit: int = 20) -> list[dict[str, Any]]:
    """What grew between two censuses (Census objects or lists of TensorRecord), by kind and
    name, the biggest growth in bytes first: {"kind", "name", "count_before", "count_after",
    "bytes_before", "bytes_after", "grew"}."""
    totals: dict[tuple[str, str], list[int]] = {}
    for index, census in enumerate((before, after)):
        for record in _records(census):
            entry = totals.setdefault(_key(record), [0, 0, 0, 0])
            entry[index] += 1
            entry[2 + index] += int(record.bytes)
    out: list[dict[str, Any]] = []
    for (kind, name), (n0, n1, b0, b1) in totals.items():
        if b1 > b0 or n1 > n0:
            out.append(
                {
                    "kind": kind,
                    "name": name,
                    "count_before": n0,
                    "count_after": n1,
                    "bytes_before": b0,
                    "bytes_after": b1,
                    "grew": b1 - b0,
                }
            )
    out.sort(key=lambda e: (e["grew"], e["count_after"] - e["count_before"]), reverse=True)
    return out[:limit]


def grew_by_kind(before: Any, after: Any) -> dict[str, int]:
    """Bytes gained (or lost, negative) per kind between two censuses."""
    out: dict[str, int] = {}
    for sign, census in ((-1, before), (1, after)):
        for record in _records(census):
            out[record.kind] = out.get(record.kind, 0) + sign * int(record.bytes)
    return out
