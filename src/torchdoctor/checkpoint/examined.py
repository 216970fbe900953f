"""What `torchdoctor ckpt` says about a file, as records: `examine` (checkpoint/examine.py)
returns a `CheckpointReport`, report/checkpoint.py renders it, and `--format json` is the
record through the one encoder. Field names are the JSON's keys, in its order; where a key
appears only in some cases (a node's `value`, a report's `problem`) the record's `to_json`
says when."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from torchdoctor._json import fields
from torchdoctor.checkpoint.keys import Remap


@dataclasses.dataclass(frozen=True)
class GroupCount:
    """Tensors of one dtype (or on one device), and the bytes of their storages."""

    tensors: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class NeededGlobal:
    """A global the pickle names beyond what torch's weights_only loader allows, and why the
    file has it."""

    name: str
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"global": self.name, "why": self.why}


@dataclasses.dataclass(frozen=True)
class StateDictInfo:
    path: str  # dotted, "" for the top level
    tensors: int
    bytes: int
    from_module_object: bool  # rebuilt from a pickled nn.Module
    keys: dict[str, list[int]]  # the first keys and their shapes


@dataclasses.dataclass(frozen=True)
class Node:
    """A node of the file's object tree: a tensor, a plain value, or a container (with its
    tensors' count and bytes, and its children down to a depth)."""

    name: str
    type: str
    kind: Literal["tensor", "value", "container"]
    value: object = None  # a plain value (None is one)
    dtype: str | None = None
    shape: list[int] | None = None
    device: str | None = None
    bytes: int = 0
    tensors: int = 0
    len: int = 0
    state_dict: bool = False  # a state dict: not expanded
    children: list[Node] = dataclasses.field(default_factory=list)
    more: int = 0  # children left out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type}
        if self.kind == "tensor":
            out.update(dtype=self.dtype, shape=self.shape, device=self.device, bytes=self.bytes)
        elif self.kind == "value":
            out["value"] = self.value
        else:
            out.update(tensors=self.tensors, bytes=self.bytes, len=self.len)
            if self.state_dict:
                out["state_dict"] = True
            if self.children:
                out["children"] = self.children
            if self.more:
                out["more"] = self.more
        return out


@dataclasses.dataclass(frozen=True)
class ShapeMismatch:
    """A model key whose tensor in the checkpoint (under the name `source`) has another
    shape."""

    key: str
    checkpoint: list[int]
    model: list[int]
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "checkpoint": self.checkpoint, "model": self.model,
                "from": self.source}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Head:
    """A classifier head with another number of classes."""

    module: str
    checkpoint_classes: int
    model_classes: int
    keys: list[str]


@dataclasses.dataclass(frozen=True)
class KeyCounts:
    matched: int
    missing: int
    unexpected: int


@dataclasses.dataclass(frozen=True)
class ModelReport:
    """The chosen state dict against the model --model builds."""

    loads_strictly: bool
    fixable_by_renaming: bool
    remap: Remap  # the renaming that makes its keys the model's
    remap_steps: list[str]
    renamed: int
    matched: int
    missing: list[str]
    unexpected: list[str]
    mismatched: list[ShapeMismatch]
    heads: list[Head]
    before_remap: KeyCounts
    causes: list[str]
    factory: str
    model_type: str
    model_tensors: int
    state_dict: str
    state_dict_tensors: int
    code: str | None  # the repair in the user's own code


@dataclasses.dataclass(frozen=True)
class FixFailed:
    """--fix wrote nothing."""

    out: str
    written: bool
    loads_strictly: bool | None
    error: str


@dataclasses.dataclass(frozen=True)
class FixedForModel:
    """--fix with --model: the model's state dict filled from the checkpoint."""

    out: str
    written: bool
    loads_strictly: bool
    renamed: int
    from_checkpoint: int
    from_model: list[str]  # keys left at the model's own values
    dropped: list[str]
    filled_share: float
    load_error: str | None


@dataclasses.dataclass(frozen=True)
class Extracted:
    """--fix without --model: the state dict alone, wrapper prefixes removed."""

    out: str
    written: bool
    loads_strictly: None
    state_dict: str
    tensors: int
    remap: Remap  # the renaming that makes its keys the model's
    remap_steps: list[str]


Fix = FixFailed | FixedForModel | Extracted


@dataclasses.dataclass(frozen=True)
class CheckpointReport:
    file: str
    format: str  # "zip", "legacy" or "safetensors"
    file_bytes: int
    metadata: dict[str, object]
    loads_weights_only: bool
    weights_only_error: str | None
    torch_says: str | None
    needs_code: list[NeededGlobal]
    tensors: int
    bytes: int
    dtypes: dict[str, GroupCount]  # the most bytes first
    devices: dict[str, GroupCount]
    state_dicts: list[StateDictInfo]
    structure: Node
    model: ModelReport | None = None
    fix: Fix | None = None
    problem: str | None = None  # why --model or --fix could not be done
    status: str = "ok"  # ok, needs_code, mismatch, fixed, not_fixed, no_state_dict

    def to_json(self) -> dict[str, Any]:
        out = fields(self)
        if self.problem is None:
            del out["problem"]
        return out
