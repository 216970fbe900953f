"""The models of a run: found as the outermost module calls (or named with watch()), and the
qualified names of their modules and parameters."""

from __future__ import annotations

import sys
import weakref
from typing import Any

from torchdoctor.store.schema import MODULES
from torchdoctor.views import indexed


class Models:
    def __init__(self) -> None:
        self._roots: list[tuple[weakref.ref[Any], str]] = []
        self._root_ids: set[int] = set()
        self._names: dict[int, str] = {}  # id(module) -> qualified name
        self._params: dict[int, tuple[str, str]] = {}  # id(param) -> (module name, param name)
        self.version = 0

    # -- roots ------------------------------------------------------------------------------
    def is_root(self, module: Any) -> bool:
        return id(module) in self._root_ids

    def roots(self) -> list[tuple[Any, str]]:
        out = []
        for ref, label in self._roots:
            module = ref()
            if module is not None:
                out.append((module, label))
        return out

    def models(self) -> list[tuple[Any, str]]:
        """Roots that own parameters: the models (loss modules are roots without any)."""
        return [(m, label) for m, label in self.roots() if has_params(m)]

    def add(self, module: Any, label: str | None = None, held_as: str | None = None) -> bool:
        """Record a root module; True when it was new. Its modules are named as the script
        reaches them: `held_as` (its path in the module the calling code holds, Lightning's
        `self.net`) and the model's name are their prefix when the names alone would not say
        where they are (`net.4`, not `4`); a model whose modules have names of their own keeps
        them (`transformer.h.3.attn`)."""
        if id(module) in self._root_ids:
            return False
        if id(module) in self._names and label is None:
            return False  # a submodule of a known model called on its own
        label = label or held_as or _label_for(module, {lbl for _, lbl in self._roots})
        try:
            self._roots.append((weakref.ref(module), label))
        except TypeError:
            return False
        self._root_ids.add(id(module))
        primary = len(self.models()) <= 1 and has_params(module)
        bare = held_as is not None or indexed(module)
        prefix = "" if primary and not bare else f"{label}."
        self._names[id(module)] = label
        for name, sub in module.named_modules():
            if name:
                self._names.setdefault(id(sub), prefix + name)
        for mod_name, sub in module.named_modules():
            qual = self._names.get(id(sub), prefix + mod_name) if mod_name else label
            for pname, param in sub.named_parameters(recurse=False):
                self._params.setdefault(id(param), (qual, pname))
        self.version += 1
        return True

    def name_of(self, module: Any) -> str:
        name = self._names.get(id(module))
        return name if name is not None else type(module).__name__

    def param_name(self, param: Any) -> tuple[str, str] | None:
        return self._params.get(id(param))

    def module_rows(self, module: Any, label: str) -> list[tuple[Any, ...]]:
        rows = []
        for name, sub in module.named_modules():
            own = list(sub.parameters(recurse=False))
            first = own[0] if own else next(iter(sub.buffers(recurse=False)), None)
            rows.append(
                (
                    label,
                    name,
                    type(sub).__name__,
                    sum(p.numel() for p in own),
                    sum(p.numel() for p in own if p.requires_grad),
                    str(first.device) if first is not None else None,
                    str(first.dtype).removeprefix("torch.") if first is not None else None,
                    name.count(".") + 1 if name else 0,
                )
            )
        assert all(len(r) == len(MODULES.columns) for r in rows)
        return rows


def has_params(module: Any) -> bool:
    return next(iter(module.parameters()), None) is not None


def _label_for(module: Any, taken: set[str]) -> str:
    """The name the script gave the model (`model`, `net`), else its class name."""
    label = None
    main = sys.modules.get("__main__")
    if main is not None:
        for key, value in list(vars(main).items()):
            if value is module and not key.startswith("_"):
                label = key
                break
    label = label or type(module).__name__
    base, n = label, 2
    while label in taken:
        label, n = f"{base}{n}", n + 1
    return label
