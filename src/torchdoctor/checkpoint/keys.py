"""Comparing a checkpoint's state dict with a model's: which keys are missing, unexpected or of
another shape, why (the common causes, named), and the renaming that repairs what renaming can.

The causes recognised:

- ``module.`` before every key: saved from DistributedDataParallel or DataParallel;
- ``_orig_mod.`` (anywhere in the keys): saved from a torch.compile'd model or submodule;
- another wrapper prefix added or missing (``model.``, ``backbone.``, ``encoder.``): the model
  was saved inside (or without) a wrapper module;
- a classifier head with another number of classes: the last layers' first dimension differs;
- keys the model has that the file lacks, or the reverse, which no renaming explains.

Pure data (key -> shape), no torch.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from typing import Any

Shape = tuple[int, ...]
WRAPPERS = ("_orig_mod", "module")  # segments that wrappers insert; dropped wherever they are
MIN_TAIL_SEGMENTS = 2  # a suffix match needs "layer.weight", not just "weight"


@dataclasses.dataclass(frozen=True)
class Remap:
    """How checkpoint keys become model keys: drop wrapper segments, then replace a leading
    prefix `strip` by `add`."""

    drop: tuple[str, ...] = ()
    strip: str = ""
    add: str = ""

    def __call__(self, key: str) -> str:
        if self.drop:
            key = ".".join(p for p in key.split(".") if p not in self.drop)
        if self.strip and key.startswith(self.strip):
            key = key[len(self.strip) :]
        return self.add + key

    @property
    def identity(self) -> bool:
        return not (self.drop or self.strip or self.add)

    def describe(self) -> list[str]:
        """Each step in words, with the cause it usually has."""
        out = []
        for seg in self.drop:
            if seg == "module":
                out.append(
                    "remove the 'module.' prefix: the checkpoint was saved from a "
                    "DistributedDataParallel / DataParallel wrapper (save model.module."
                    "state_dict() to avoid it)"
                )
            elif seg == "_orig_mod":
                out.append(
                    "remove '_orig_mod.': the checkpoint was saved from a torch.compile'd "
                    "model (save the original module's state_dict(), or "
                    "getattr(model, '_orig_mod', model).state_dict())"
                )
        if self.strip and self.add:
            out.append(
                f"replace the prefix {self.strip!r} with {self.add!r}: the model is wrapped "
                "differently than when it was saved"
            )
        elif self.strip:
            out.append(
                f"remove the prefix {self.strip!r}: the checkpoint was saved from a wrapper "
                "module around this model (load it into that wrapper, or strip the prefix)"
            )
        elif self.add:
            out.append(
                f"add the prefix {self.add!r}: the model wraps the saved one as "
                f"{self.add.rstrip('.')!r}"
            )
        return out


@dataclasses.dataclass
class Comparison:
    remap: Remap
    matched: list[str]  # model keys found (after the remap) with the right shape
    missing: list[str]  # model keys the checkpoint lacks
    unexpected: list[str]  # checkpoint keys (original names) the model lacks
    mismatched: list[dict[str, Any]]  # {"key", "checkpoint", "model"} shapes
    heads: list[dict[str, Any]]  # classifier heads with another number of classes
    renamed: int  # keys the remap changes
    before: dict[str, int]  # counts without the remap: matched, missing, unexpected

    @property
    def loads_strictly(self) -> bool:
        return self.remap.identity and not (self.missing or self.unexpected or self.mismatched)

    @property
    def fixable(self) -> bool:
        """Renaming alone makes it load strictly."""
        return not (self.missing or self.unexpected or self.mismatched)

    def causes(self) -> list[str]:
        out = self.remap.describe()
        for head in self.heads:
            out.append(
                f"a head with another number of classes at {head['module']!r}: the checkpoint "
                f"has {head['checkpoint_classes']}, the model {head['model_classes']} "
                "(fine-tuning on another label set: keep the model's own head)"
            )
        buffers = [k for k in self.missing if k.endswith(("num_batches_tracked", "position_ids"))]
        if buffers:
            out.append(
                f"{len(buffers)} buffer(s) the model registers that the checkpoint predates "
                f"({buffers[0]}...): harmless, the model's own values are used"
            )
        others = [k for k in self.missing if k not in buffers]
        if others:
            out.append(
                f"{len(others)} model key(s) not in the checkpoint ({_few(others)}): layers "
                "added since it was saved, or another architecture / configuration"
            )
        if self.unexpected:
            out.append(
                f"{len(self.unexpected)} checkpoint key(s) the model lacks "
                f"({_few(self.unexpected)}): layers removed since, or another architecture"
            )
        shapes = [m for m in self.mismatched if not any(m["key"] in h["keys"] for h in self.heads)]
        if shapes:
            m = shapes[0]
            out.append(
                f"{len(shapes)} key(s) of another shape ({m['key']}: checkpoint "
                f"{_fmt(m['checkpoint'])}, model {_fmt(m['model'])}): another configuration "
                "(hidden size, vocabulary, number of heads)"
            )
        return out


def _few(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (", ..." if len(keys) > n else "")


def _fmt(shape: Any) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def _segments_present(keys: Any, seg: str) -> bool:
    return any(seg in k.split(".") for k in keys)


def _prefix_pairs(ck: list[str], model: set[str]) -> collections.Counter[tuple[str, str]]:
    """For each checkpoint key, the (checkpoint prefix, model prefix) around the longest tail
    it shares with a model key: ("backbone.", "") when the model lacks a wrapper level."""
    by_tail: dict[str, set[str]] = collections.defaultdict(set)
    for m in model:
        parts = m.split(".")
        for i in range(len(parts)):
            by_tail[".".join(parts[i:])].add(".".join(parts[:i]) + "." if i else "")
    pairs: collections.Counter[tuple[str, str]] = collections.Counter()
    for k in ck:
        parts = k.split(".")
        for i in range(len(parts)):
            tail = ".".join(parts[i:])
            if len(parts) - i < MIN_TAIL_SEGMENTS and i > 0:
                break
            heads = by_tail.get(tail)
            if heads:
                ck_prefix = ".".join(parts[:i]) + "." if i else ""
                for head in heads:
                    if (ck_prefix, head) != ("", ""):
                        pairs[(ck_prefix, head)] += 1
                break
    return pairs


def find_remap(ck: Mapping[str, Shape], model: Mapping[str, Shape]) -> Remap:
    """The renaming of checkpoint keys that matches most model keys (identity when none does
    better). On a tie the simpler and better named one wins: dropping wrapper segments
    (`module.`, `_orig_mod.`) before a prefix change."""
    model_keys = set(model)
    drop = tuple(
        seg
        for seg in WRAPPERS
        if _segments_present(ck, seg) and not _segments_present(model_keys, seg)
    )
    candidates = [Remap()]
    for base in [Remap(drop), Remap()] if drop else [Remap()]:
        candidates.append(base)
        names = [base(k) for k in ck]
        for (strip, add), _n in _prefix_pairs(names, model_keys).most_common(5):
            candidates.append(Remap(base.drop, strip, add))
    best, best_score = candidates[0], _score(candidates[0], ck, model_keys)
    for option in candidates[1:]:
        score = _score(option, ck, model_keys)
        if score > best_score:
            best, best_score = option, score
    return best


def _score(remap: Remap, ck: Mapping[str, Shape], model: set[str]) -> int:
    return sum(1 for k in ck if remap(k) in model)


def _heads(mismatched: list[dict[str, Any]], model: Mapping[str, Shape]) -> list[dict[str, Any]]:
    """Mismatches that are a classifier with another number of outputs: weight [C, F] against
    [C', F] (same F) with its bias, when it has one, [C] against [C']."""
    by_module: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    for item in mismatched:
        module, _, leaf = item["key"].rpartition(".")
        by_module[module][leaf] = item
    heads = []
    for module, leaves in by_module.items():
        w = leaves.get("weight")
        if w is None or len(w["checkpoint"]) != len(w["model"]) or not w["model"]:
            continue
        c, m = list(w["checkpoint"]), list(w["model"])
        if c[0] == m[0] or c[1:] != m[1:]:
            continue
        b = leaves.get("bias")
        if b is None and f"{module}.bias" in model:
            continue  # its bias fits: the layer's input changed, not its number of outputs
        if b is not None and (list(b["checkpoint"]) != c[:1] or list(b["model"]) != m[:1]):
            continue
        keys = [f"{module}.weight"] + ([f"{module}.bias"] if b is not None else [])
        heads.append(
            {"module": module, "checkpoint_classes": c[0], "model_classes": m[0], "keys": keys}
        )
    return heads


def compare(ck: Mapping[str, Shape], model: Mapping[str, Shape]) -> Comparison:
    remap = find_remap(ck, model)
    renamed_to: dict[str, str] = {}
    for k in ck:
        renamed_to.setdefault(remap(k), k)  # two keys mapping to one name: the first wins
    matched, missing, mismatched = [], [], []
    for key, shape in model.items():
        source = renamed_to.get(key)
        if source is None:
            missing.append(key)
        elif tuple(ck[source]) != tuple(shape):
            mismatched.append(
                {"key": key, "checkpoint": list(ck[source]), "model": list(shape), "from": source}
            )
        else:
            matched.append(key)
    used = {renamed_to[k] for k in model if k in renamed_to}
    unexpected = [k for k in ck if k not in used]
    plain = set(ck)
    before = {
        "matched": sum(1 for k in model if k in plain and tuple(ck[k]) == tuple(model[k])),
        "missing": sum(1 for k in model if k not in plain),
        "unexpected": sum(1 for k in ck if k not in model),
    }
    return Comparison(
        remap=remap,
        matched=matched,
        missing=missing,
        unexpected=unexpected,
        mismatched=mismatched,
        heads=_heads(mismatched, model),
        renamed=sum(1 for k in ck if remap(k) != k),
        before=before,
    )
