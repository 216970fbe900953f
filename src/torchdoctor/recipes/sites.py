"""Where the script called something: the first frame outside torch, NumPy, the standard
library's `random` and torchdoctor, as `file:line` (relative to the current directory when it
is under it)."""

from __future__ import annotations

import os
import random
import types

from torchdoctor.frames import short_path

_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the torchdoctor package
_SKIP = [os.path.abspath(random.__file__)]
# torchdoctor's wrappers around the script's own calls (telemetry/torch_hooks.py, the overfit
# replay, the repro watchers): what runs under them is the script's work, not torchdoctor's
PASS_THROUGH = frozenset(
    {"backward", "__next__", "__iter__", "_get_iterator", "scale", "step", "clip_grad_norm_",
     "compile", "loss", "draw", "seed", "default_rng",
     "init_call", "generate"}  # telemetry/silent: torch.nn.init's functions, generate()
)  # fmt: skip


def skip_package(module: types.ModuleType) -> None:
    """Frames in this package's directory are not call sites (torch, numpy)."""
    path = os.path.dirname(os.path.abspath(str(module.__file__))) + os.sep
    if path not in _SKIP:
        _SKIP.append(path)


def user_site(frame: types.FrameType | None, depth: int = 40) -> str | None:
    """`file:line` of the first frame of the script's (or a library's) code; "" when that frame
    is torchdoctor's own (its calls are not the script's); None when none is found."""
    while frame is not None and depth > 0:
        path = frame.f_code.co_filename
        if path.startswith(_OWN):
            if frame.f_code.co_name not in PASS_THROUGH:
                return ""
        elif not path.startswith("<") and not any(path.startswith(p) for p in _SKIP):
            return f"{short_path(path)}:{frame.f_lineno}"
        frame = frame.f_back
        depth -= 1
    return None
