"""Finding the models of a run without global module hooks.

Global module hooks see every module call, which is how the first step usually finds the
outermost calls. Under torch.compile they cannot be used: Dynamo would trace them, and adding
or removing them changes what its guards see, so it would recompile. There the models are
found from what the training code holds: the modules in the local variables of the frames
that called backward() (and one level into objects such as `self`, lists and dicts), and in
`__main__`. The outermost of them are the models.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from torchdoctor.frames import is_own

if TYPE_CHECKING:
    from types import FrameType


def modules_in_reach(module_cls: Any, frame: FrameType | None, limit: int = 64) -> list[Any]:
    """The modules referenced from the calling frames and __main__, outermost only."""
    found: dict[int, Any] = {}

    def take(value: Any, depth: int) -> None:
        if isinstance(value, module_cls):
            found.setdefault(id(value), value)
        elif depth and isinstance(value, (list, tuple)):
            for item in value[:32]:
                take(item, depth - 1)
        elif depth and isinstance(value, dict):
            for item in list(value.values())[:32]:
                take(item, depth - 1)
        elif depth and hasattr(value, "__dict__") and not isinstance(value, type):
            try:
                attributes = list(vars(value).values())
            except TypeError:
                return
            for item in attributes[:64]:
                take(item, depth - 1)

    seen = 0
    while frame is not None and seen < limit:
        if not is_own(frame.f_code.co_filename):
            for value in list(frame.f_locals.values()):
                take(value, 1)
        frame = frame.f_back
        seen += 1
    main = sys.modules.get("__main__")
    if main is not None:
        for key, value in list(vars(main).items()):
            if not key.startswith("__"):
                take(value, 1)
    return outermost(list(found.values()))


def outermost(modules: list[Any]) -> list[Any]:
    """Those of `modules` that are not inside another one."""
    inner: set[int] = set()
    for module in modules:
        for sub in module.modules():
            if sub is not module:
                inner.add(id(sub))
    return [m for m in modules if id(m) not in inner]


def path_in_owner(module: Any, frame: FrameType | None) -> str | None:
    """The attribute path of `module` inside the module the calling frame runs a method of
    (`self.net(x)` in a LightningModule's training_step: `net`), or None."""
    if frame is None or not frame.f_code.co_argcount:
        return None
    try:
        owner = frame.f_locals.get(frame.f_code.co_varnames[0])
    except Exception:
        return None
    named = getattr(owner, "named_modules", None)
    if owner is module or named is None:
        return None
    try:
        for name, sub in named():
            if sub is module and name:
                return str(name)
    except Exception:
        return None
    return None
