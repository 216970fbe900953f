"""Weights initialised again by the code that initialised them: `post_init()` / `init_weights()`
run once per nested model class (TrainCheck's transformers-17877), a `reset_parameters()` loop
run twice. The weights end up right; the start is slow and the work wasted.

The public functions of `torch.nn.init` are wrapped (removably, `functools.wraps`). A call is
noted only when it is the outermost one (an init function that calls another is one
initialisation), on the training thread, not while compiling or tracing, and when the code that
called it is not torch's own (a layer's constructor runs its `reset_parameters()`: expected,
once per layer). Its site is the first frame outside torch and torchdoctor that is not a
same-named pass-through (transformers' guarded `normal_` calls torch's: the line that matters is
the one in `_init_weights`). A tensor is told by its storage (a weak reference: ids are reused
once freed), offset, shape and stride: `.data` gives a new tensor object over the same memory.

A tensor initialised twice from the same site is the bug (the same code run again over the same
weights), unless it is a weight tied between modules, which one pass over the modules reaches
once per module that holds it. Twice from two sites is legitimate: nanoGPT re-initialises
`c_proj.weight` with a scaled normal after `apply(_init_weights)`. Judged once, at the end of
the first step with an optimizer update (or when the run ends without one):
`silent.repeated_init`; nothing is noted after that, and the wrappers only pass calls through.

`kaiming_uniform_` and `kaiming_normal_` warn on a zero-element tensor with `stacklevel=2`: the
wrapper gives that warning itself (same text, same caller) instead of calling them, so that it
still points at the caller's line and not at this file.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any

from torchdoctor.frames import is_own, is_torch, site, user_frame
from torchdoctor.telemetry.invisible import skip_own_frames, tracing
from torchdoctor.telemetry.patches import ORIGINAL, unpatched

if TYPE_CHECKING:
    from types import FrameType

    from torchdoctor.telemetry.patches import Hooks

INIT_FUNCTIONS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "dirac_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
    "sparse_",
)
ZERO_ELEMENT_WARNING = "Initializing zero-element tensors is a no-op"
MAX_TENSORS = 200_000  # beyond this many tensors noted, stop noting (a bounded table)
NAMES_SHOWN = 4


@dataclasses.dataclass
class Noted:
    """One tensor's initialisations so far: site -> [calls, seconds of the calls after the first,
    the user's line at the second call]."""

    storage: Any  # weakref to its storage
    shape: tuple[int, ...]
    sites: dict[str, list[Any]] = dataclasses.field(default_factory=dict)


class Initialisations:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.noting = True  # until judged
        self.judged = False
        self.depth = 0  # init calls in progress on the training thread
        self.table: dict[tuple[Any, ...], Noted] = {}

    def install(self, torch: Any, hooks: Hooks) -> None:
        from torchdoctor.telemetry.silent.hooks import thread_check

        on = thread_check(self.host)
        init = torch.nn.init
        tensor_function = torch.overrides.has_torch_function_variadic
        wrappers = []
        for name in INIT_FUNCTIONS:
            original = unpatched(init.__dict__.get(name))
            if original is None or not callable(original):
                continue
            consts = getattr(getattr(original, "__code__", None), "co_consts", ())
            zero_warns = ZERO_ELEMENT_WARNING in consts
            wrapper = self._wrap(original, name, on, zero_warns, tensor_function)
            hooks.patch(init, name, wrapper)
            wrappers.append(wrapper)
        skip_own_frames(*wrappers)

    def _wrap(self, original: Any, name: str, on: Any, zero_warns: bool, has_tf: Any) -> Any:
        inits = self

        @functools.wraps(original)
        def init_call(*args: Any, **kwargs: Any) -> Any:
            tensor = args[0] if args else kwargs.get("tensor")
            if zero_warns and 0 in getattr(tensor, "shape", (1,)) and not has_tf(tensor):
                # What the original does here, from this frame: its stacklevel=2 would name
                # this file.
                warnings.warn(ZERO_ELEMENT_WARNING, stacklevel=2)
                return tensor
            if inits.depth or not inits.noting or not on() or tracing():
                return original(*args, **kwargs)
            where = _site(sys._getframe(1), name)
            if where is None:
                return original(*args, **kwargs)
            inits.depth += 1
            try:
                start = time.perf_counter()
                out = original(*args, **kwargs)
                seconds = time.perf_counter() - start
            finally:
                inits.depth -= 1
            try:
                inits.note(tensor, where, seconds)
            except Exception as exc:
                inits.host.fail(exc)
            return out

        setattr(init_call, ORIGINAL, original)
        return init_call

    def note(self, tensor: Any, where: tuple[str, Any], seconds: float) -> None:
        torch = self.host.torch
        if not isinstance(tensor, torch.Tensor) or tensor.is_meta or tensor.numel() == 0:
            return
        try:
            storage = tensor.untyped_storage()
            key = (id(storage), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
            ref = weakref.ref(storage)
        except Exception:  # a tensor without a storage of its own (sparse, a wrapper subclass)
            return
        noted = self.table.get(key)
        if noted is None or noted.storage() is not storage:  # new, or an id reused
            if len(self.table) >= MAX_TENSORS:
                self.noting = False
                return
            noted = self.table[key] = Noted(ref, tuple(tensor.shape))
        line, frame = where
        calls = noted.sites.get(line)
        if calls is None:
            noted.sites[line] = [1, 0.0, None]
            return
        calls[0] += 1
        calls[1] += seconds
        if calls[2] is None:
            calls[2] = site(user_frame(frame))

    def judge(self, step: int) -> None:
        """Write what was initialised more than once from one site (once per run), at `step`."""
        if self.judged:
            return
        self.judged = True
        self.noting = False
        table, self.table = self.table, {}
        by_site: dict[str, dict[str, Any]] = {}
        repeated = []
        for key, noted in table.items():
            if noted.storage() is None:
                continue
            for line, (calls, seconds, user) in noted.sites.items():
                if calls >= 2:
                    repeated.append((key, line, calls, seconds, user))
        if not repeated:
            return
        names = self._names()
        for key, line, calls, seconds, user in repeated:
            name, holders = names.get(key, (None, 1))
            if calls <= holders:
                continue  # a tied weight: one pass over the modules reaches it once per holder
            entry = by_site.setdefault(
                line, {"site": line, "caller": user, "tensors": 0, "names": [], "times": 0}
            )
            entry["tensors"] += 1
            entry["times"] = max(entry["times"], calls)
            entry["seconds"] = entry.get("seconds", 0.0) + seconds
            if len(entry["names"]) < NAMES_SHOWN:
                entry["names"].append(name or f"a tensor of shape {list(key[2])}")
        if not by_site:
            return
        sites = sorted(by_site.values(), key=lambda s: (-s["tensors"], s["site"]))
        for entry in sites:
            entry["seconds"] = round(entry["seconds"], 6)
        data = {
            "step": step,
            "site": sites[0]["site"],
            "names": sites[0]["names"],  # the first few, at the site with the most
            "times": sites[0]["times"],
            "tensors": sum(s["tensors"] for s in sites),
            "seconds": round(sum(s["seconds"] for s in sites), 6),
            "sites": sites,
        }
        self.host.emit("repeated_init", data, key="repeated_init")

    def _names(self) -> dict[tuple[Any, ...], tuple[str, int]]:
        """(qualified name, how many modules hold it) of the known models' parameters and
        buffers, by tensor key: a tied weight is held by two modules."""
        rec = self.host.rec
        out: dict[tuple[Any, ...], tuple[str, int]] = {}
        for root, label in rec.models.models():
            tensors = [
                *root.named_parameters(remove_duplicate=False),
                *root.named_buffers(remove_duplicate=False),
            ]
            for name, tensor in tensors:
                try:
                    storage = tensor.untyped_storage()
                    offset, shape = tensor.storage_offset(), tuple(tensor.shape)
                    key = (id(storage), offset, shape, tensor.stride())
                except Exception:
                    continue
                known = rec.models.param_name(tensor)
                qualified = ".".join(p for p in known if p) if known else name
                known_as = out.get(key)
                out[key] = (known_as[0], known_as[1] + 1) if known_as else (qualified or label, 1)
        return out


def _site(frame: FrameType | None, name: str) -> tuple[str, Any] | None:
    """(file:line, frame) of the code that asked for this initialisation, or None when it is
    torch's own (a layer's reset_parameters())."""
    while frame is not None:
        code = frame.f_code
        if is_own(code.co_filename) or code.co_name == name:
            frame = frame.f_back  # our frames, and same-named wrappers (transformers' guard)
            continue
        if is_torch(code.co_filename):
            return None
        return f"{code.co_filename}:{frame.f_lineno}", frame
    return None
