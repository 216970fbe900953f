"""A checkpoint as data: its nesting, tensors, bytes, dtypes, devices, the state dicts it holds,
and whether torch's `weights_only` loader accepts it (and if not, which globals it needs)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from torchdoctor.checkpoint.examined import (
    CheckpointReport,
    GroupCount,
    NeededGlobal,
    Node,
    StateDictInfo,
)
from torchdoctor.checkpoint.reader import (
    Checkpoint,
    Stand,
    TensorRef,
    children,
    is_stand,
    iter_tensors,
    qualname_of,
)

MAX_DEPTH = 6
MAX_CHILDREN = 40
MAX_KEYS = 5000
# Names under which training scripts keep the model's weights, most likely first.
MODEL_KEYS = (
    "model",
    "state_dict",
    "model_state_dict",
    "model_state",
    "net",
    "network",
    "module",
    "model_ema",
    "ema",
    "params",
    "weights",
)
# Globals that can run arbitrary code when a pickle is loaded normally: a file naming them
# was made to do so.
DANGEROUS = re.compile(
    r"^(?:builtins|__builtin__)\.(?:eval|exec|compile|open|__import__|getattr|setattr)$"
    r"|^(?:os|posix|nt|subprocess|pty|runpy|shutil|socket|sys|importlib|webbrowser)\."
    r"|^(?:pickle|_pickle|marshal|ctypes|code|codeop|pdb)\."
)
_UNSUPPORTED = re.compile(r"Unsupported global: GLOBAL ([\w.]+)|GLOBAL ([\w.]+) was not an allowed")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _type_name(value: Any) -> str:
    if isinstance(value, TensorRef):
        return "Parameter" if value.parameter else "tensor"
    if is_stand(value):
        return qualname_of(value)
    return type(value).__name__


def _shape(t: TensorRef) -> list[int]:
    return list(t.shape)


def is_state_dict(value: Any) -> bool:
    """A dict whose values are tensors (a module's `_extra_state` entries allowed)."""
    if not isinstance(value, dict) or not value:
        return False
    tensors = 0
    for key, item in value.items():
        if isinstance(item, TensorRef):
            tensors += 1
        elif not str(key).endswith("_extra_state"):
            return False
    return tensors > 0


def module_state_dict(value: Any, prefix: str = "") -> dict[str, TensorRef] | None:
    """The state dict of a whole pickled nn.Module, read from its pickled attributes
    (`_parameters`, `_buffers`, `_modules`) without its class: None if it is not a module."""
    if not isinstance(value, Stand) or not isinstance(value.state, dict):
        return None
    state = value.state
    if not {"_parameters", "_buffers", "_modules"} <= set(state):
        return None
    out: dict[str, TensorRef] = {}
    skip = state.get("_non_persistent_buffers_set") or set()
    for group in ("_parameters", "_buffers"):
        for name, tensor in (state.get(group) or {}).items():
            if isinstance(tensor, TensorRef) and not (group == "_buffers" and name in skip):
                out[f"{prefix}{name}"] = tensor
    for name, child in (state.get("_modules") or {}).items():
        sub = module_state_dict(child, f"{prefix}{name}.")
        if sub:
            out.update(sub)
    return out


@dataclasses.dataclass
class StateDict:
    """A state dict found in the checkpoint: where (`parts`: the keys and indices that lead
    to it), its tensors by key, and the object it was read from (a dict, or a pickled module
    whose state dict is rebuilt from its attributes)."""

    parts: tuple[str, ...]
    tensors: dict[str, TensorRef]
    source: Any

    @property
    def path(self) -> str:
        return ".".join(self.parts)

    @property
    def from_module(self) -> bool:
        return not isinstance(self.source, dict)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: t.shape for k, t in self.tensors.items()}


def state_dicts(ckpt: Checkpoint) -> list[StateDict]:
    """Every state dict in the checkpoint, the model's first: the top level, then the usual
    names (model, state_dict, ...), then the others, largest first."""
    found: list[StateDict] = []
    seen: set[int] = set()
    queue: list[tuple[tuple[str, ...], Any]] = [((), ckpt.root)]
    while queue:
        parts, value = queue.pop(0)
        if id(value) in seen or len(parts) > MAX_DEPTH:
            continue
        seen.add(id(value))
        if is_state_dict(value):
            sd = {str(k): v for k, v in value.items() if isinstance(v, TensorRef)}
            found.append(StateDict(parts, sd, value))
            continue
        module = module_state_dict(value)
        if module:
            found.append(StateDict(parts, module, value))
            continue
        for name, child in children(value):
            if isinstance(child, (dict, list, tuple, Stand)):
                queue.append(((*parts, name), child))
    # Optimizer state ("optimizer.state.0" = {exp_avg, exp_avg_sq, step}) is not a model's.
    found = [f for f in found if not (len(f.parts) >= 2 and f.parts[-2] == "state")]

    def rank(sd: StateDict) -> tuple[int, int]:
        if not sd.parts:
            return (0, 0)
        last = sd.parts[-1]
        return (1, MODEL_KEYS.index(last)) if last in MODEL_KEYS else (2, -len(sd.tensors))

    return sorted(found, key=rank)


def _node(name: str, value: Any, depth: int, sd_ids: set[int]) -> Node:
    kind = _type_name(value)
    if isinstance(value, TensorRef):
        return Node(
            name,
            kind,
            "tensor",
            dtype=value.dtype,
            shape=_shape(value),
            device=value.device,
            bytes=value.nbytes,
        )
    if isinstance(value, (bool, int, float)) or value is None:
        return Node(name, kind, "value", value=value)
    if isinstance(value, (str, bytes)):
        text = value if isinstance(value, str) else f"<{len(value)} bytes>"
        return Node(name, kind, "value", value=text if len(text) <= 80 else text[:77] + "...")
    if isinstance(value, type):
        return Node(name, kind, "value", value=qualname_of(value))
    tensors = {id(t): t for _p, t in iter_tensors(value)}
    storages = {t.storage.key: t.storage.nbytes or 0 for t in tensors.values() if t.storage}
    items = children(value)
    node = Node(
        name, kind, "container", tensors=len(tensors), bytes=sum(storages.values()), len=len(items)
    )
    if id(value) in sd_ids:
        return dataclasses.replace(node, state_dict=True)
    if depth >= MAX_DEPTH:
        return node
    return dataclasses.replace(
        node,
        children=[_node(k, v, depth + 1, sd_ids) for k, v in items[:MAX_CHILDREN]],
        more=max(0, len(items) - MAX_CHILDREN),
    )


def _by(tensors: list[TensorRef], attr: str) -> dict[str, GroupCount]:
    out: dict[str, list[int]] = {}
    counted: set[str] = set()
    for t in tensors:
        key = getattr(t, attr)
        entry = out.setdefault(key, [0, 0])
        entry[0] += 1
        if t.storage is not None and t.storage.key not in counted:
            counted.add(t.storage.key)
            entry[1] += t.storage.nbytes or 0
    ranked = sorted(out.items(), key=lambda kv: -kv[1][1])
    return {key: GroupCount(tensors=n, bytes=size) for key, (n, size) in ranked}


def _allowed_globals() -> set[str]:
    """The globals torch's weights_only loader accepts (torch's own list when it has one)."""
    try:
        from torch import _weights_only_unpickler as w
        from torch.serialization import get_safe_globals

        allowed = set(w._get_allowed_globals())
        for g in get_safe_globals():
            obj = g[0] if isinstance(g, tuple) else g
            allowed.add(f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}")
        return allowed
    except Exception:
        return set()


def weights_only_error(ckpt: Checkpoint) -> str | None:
    """None when torch.load(weights_only=True) reads the file (on the meta device: no tensor
    data is read); else torch's own message. safetensors files hold no pickle at all."""
    if ckpt.format == "safetensors":
        return None
    import torch

    try:
        torch.load(ckpt.path, map_location="meta", weights_only=True)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def needs_code(ckpt: Checkpoint, error: str | None) -> list[NeededGlobal]:
    """The globals the file needs beyond what weights_only allows, each with why it is there."""
    allowed = _allowed_globals()
    names = [
        g
        for g in ckpt.globals
        if _py3(g) not in allowed and g not in allowed and not _is_dtype_or_storage(g)
    ]
    for m in _UNSUPPORTED.finditer(error or ""):
        name = m.group(1) or m.group(2)
        if name not in names:
            names.insert(0, name)
    return [NeededGlobal(name, why_global(name, names)) for name in names]


def _py3(name: str) -> str:
    """Pickle protocol 2 names builtins as Python 2 did."""
    return "builtins." + name[len("__builtin__.") :] if name.startswith("__builtin__.") else name


def torch_says(error: str) -> str:
    """The line of torch's weights_only error that names the problem."""
    lines = [_ANSI.sub("", line).strip() for line in error.splitlines()]
    for line in lines:
        if "Unsupported global" in line or "WeightsUnpickler error" in line:
            return line
    return next((line for line in lines if line), "")


def _is_dtype_or_storage(name: str) -> bool:
    return bool(re.fullmatch(r"torch\.(?:cuda\.)?(?:\w+Storage|[a-z]\w*\d+\w*|bool)", name))


def why_global(name: str, all_names: list[str]) -> str:
    if DANGEROUS.search(name):
        return (
            "a function that runs commands or code when the file is loaded: this file may be "
            "malicious; do not load it with weights_only=False"
        )
    if name.startswith("torch.nn.modules.") or (
        any(n.startswith("torch.nn.modules.") for n in all_names) and name.startswith("__main__.")
    ):
        return "part of a whole nn.Module saved with torch.save(model): loading it needs the class"
    if name.startswith("__main__."):
        return "a class of the training script itself (__main__): it exists only in that script"
    if name.startswith(("numpy.", "_codecs.")):
        return "a NumPy value (a metric saved as np.float64, an array, a random state)"
    if name.startswith("argparse."):
        return "the script's parsed arguments (argparse.Namespace) saved with the weights"
    if name.startswith("torch.optim.lr_scheduler."):
        return "a learning-rate scheduler object (save scheduler.state_dict() instead)"
    if name.startswith("torch."):
        return "a torch object that weights_only does not allow by default"
    return "an object of a class outside torch: loading it imports and runs that code"


def summarize(ckpt: Checkpoint, check_weights_only: bool = True) -> CheckpointReport:
    """What `torchdoctor ckpt` prints of the file alone: what it holds and whether it loads
    safely (examine adds the model, the fix and the status)."""
    tensors = list({id(t): t for _p, t in iter_tensors(ckpt.root)}.values())
    sds = state_dicts(ckpt)
    sd_objects = {id(sd.source) for sd in sds}
    error = weights_only_error(ckpt) if check_weights_only else None
    code = needs_code(ckpt, error) if error or ckpt.format != "safetensors" else []
    if not error:
        code = [c for c in code if DANGEROUS.search(c.name)]
    return CheckpointReport(
        file=str(ckpt.path),
        format=ckpt.format,
        file_bytes=ckpt.size,
        metadata=ckpt.metadata,
        loads_weights_only=error is None,
        weights_only_error=error,
        torch_says=torch_says(error) if error else None,
        needs_code=code,
        tensors=len(tensors),
        bytes=sum(s.nbytes or 0 for s in ckpt.storages.values()),
        dtypes=_by(tensors, "dtype"),
        devices=_by(tensors, "device"),
        state_dicts=[
            StateDictInfo(
                path=sd.path,
                tensors=len(sd.tensors),
                bytes=sum(t.nbytes for t in sd.tensors.values()),
                from_module_object=sd.from_module,
                keys={k: _shape(t) for k, t in list(sd.tensors.items())[:MAX_KEYS]},
            )
            for sd in sds
        ],
        structure=_node("", ckpt.root, 0, sd_objects),
    )
