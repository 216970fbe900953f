"""What torchdoctor attaches to a user's objects stays invisible to everything that reads them.

- Copies and files: the one thing put on a user's module is a model hook (a function marked by
  `model_hook`, or while no torch.compile is in use its compiled twin, a builtin method of
  native/steady.cpp's SteadyStep) in its forward pre-hooks and in its forward hooks.
  `nn.Module.__getstate__` (which `copy.deepcopy`, `pickle` and `torch.save` use) is wrapped to
  leave model hooks out, so a copy is a copy of the unprobed model and no file ever holds a
  reference to torchdoctor.
- TorchScript: `torch.jit.script` compiles a module's hooks; it is wrapped to lift the
  model hooks off for the duration. `torch.jit.trace` and `torch.export` run the hooks, which
  return at once while a tracer is active (`tracing()`). (A traced archive's debug tables,
  the Python stack of each op, then hold torch's own frame for calling a module with hooks.)
- torch.compile: the compiled hooks are swapped for their Python twins at the first
  torch.compile or torch.export (telemetry/steady.py); every Python hook body starts with `if
  compiling(): return` (or its inline form, below), so when Dynamo inlines a hook inside a
  compiled region it traces a no-op (no graph break, no guard), and every hook's code object
  is marked "skip" for Dynamo's frame evaluation, so eager code between two graphs that calls
  a hook runs it as plain Python instead of compiling it as a frame.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator
from types import BuiltinMethodType, FunctionType, SimpleNamespace
from typing import Any

import torch

from torchdoctor.telemetry.patches import Hooks

# Dynamo folds torch.compiler.is_compiling() to True while it traces, so a hook whose first
# statement is `if compiling(): return` traces to nothing. (torch < 2.3 has no such function.)
compiling: Callable[[], bool] = getattr(
    getattr(torch, "compiler", None), "is_compiling", lambda: False
)
jit_tracing_state = torch._C._get_tracing_state  # not None while torch.jit.trace runs

# The hooks that run every step test `dynamo_compiling() or export_flags._is_compiling_flag`
# instead: what compiling() answers, with one Python frame instead of two (is_compiling()
# calls torch.jit.is_scripting()). Dynamo folds is_dynamo_compiling() to True, so nothing after
# it is traced; the flag is set while torch.export runs a model as plain Python (non-strict),
# the other case compiling() sees.
_compiler: Any = getattr(torch, "compiler", None)
if hasattr(_compiler, "is_dynamo_compiling") and hasattr(_compiler, "_is_compiling_flag"):
    dynamo_compiling: Callable[[], bool] = _compiler.is_dynamo_compiling
    export_flags: Any = _compiler
else:  # an older torch: compiling() itself
    dynamo_compiling = compiling
    export_flags = SimpleNamespace(_is_compiling_flag=False)


def tracing() -> bool:
    """Dynamo, torch.jit.trace or torch.export is running the model (not the training)."""
    # Under Dynamo this folds to True at compiling() and never reaches the jit check.
    return bool(compiling() or jit_tracing_state() is not None)


# Where a module keeps its hooks: the hooks (id -> hook), and the sets (or dicts) of ids
# that hold options of some of them.
_PRE = "_forward_pre_hooks"
_POST = "_forward_hooks"
_OPTIONS = {
    _PRE: ("_forward_pre_hooks_with_kwargs",),
    _POST: ("_forward_hooks_with_kwargs", "_forward_hooks_always_called"),
}


ModelHook = Callable[[Any, Any, Any], None]  # (module, args, kwargs or output) -> None
_MARK = "__torchdoctor_model_hook__"


def model_hook(fn: ModelHook) -> ModelHook:
    """`fn`, marked as a forward pre-hook or hook of torchdoctor's: the mark is how copies,
    pickles and TorchScript tell it apart from the user's own hooks. torch calls it directly
    (a model's call runs it every step: no frame of a wrapper between)."""
    setattr(fn, _MARK, True)
    return fn


def is_model_hook(hook: Any) -> bool:
    if type(hook) is BuiltinMethodType:  # a compiled hook (native/steady.cpp's SteadyStep)
        owner = type(hook.__self__)
        return owner.__module__ == "torchdoctor.native._kernels" and owner.__name__ == "SteadyStep"
    return type(hook) is FunctionType and hook.__dict__.get(_MARK) is True


def _ours(hooks: dict[Any, Any] | None) -> list[Any]:
    return [k for k, h in hooks.items() if is_model_hook(h)] if hooks else []


def _without_ours(state: dict[str, Any]) -> dict[str, Any]:
    for name, options in _OPTIONS.items():
        hooks = state.get(name)
        ours = set(_ours(hooks))
        if not ours or hooks is None:
            continue
        state[name] = OrderedDict((k, h) for k, h in hooks.items() if k not in ours)
        for option in options:
            held = state.get(option)
            if held:
                state[option] = OrderedDict((k, v) for k, v in held.items() if k not in ours)
    return state


@contextlib.contextmanager
def _lifted(root: Any) -> Iterator[None]:
    """Our model hooks taken off every module under `root`, put back in their places afterwards."""
    saved: list[tuple[Any, list[Any]]] = []  # (a hook dict or an option dict, its items)
    for module in root.modules():
        for name, options in _OPTIONS.items():
            hooks = module.__dict__.get(name)
            ours = _ours(hooks)
            if not ours:
                continue
            for held in (hooks, *(module.__dict__.get(o) for o in options)):
                if held is not None:
                    saved.append((held, list(held.items())))
                    for key in ours:
                        held.pop(key, None)
    try:
        yield
    finally:
        for held, items in saved:
            held.clear()
            held.update(items)


def install(torch: Any, hooks: Hooks) -> None:
    """Wrap Module.__getstate__ and torch.jit.script; undone by `hooks.remove()`."""
    module_cls = torch.nn.Module
    original_getstate = module_cls.__dict__["__getstate__"]

    def __getstate__(self: Any) -> Any:
        return _without_ours(original_getstate(self))

    functools.update_wrapper(__getstate__, original_getstate)
    hooks.patch(module_cls, "__getstate__", __getstate__)

    original_script = torch.jit.script
    if "_frames_up" not in inspect.signature(original_script).parameters:
        return  # a torch whose script() we cannot wrap without moving its name resolution

    def script(obj: Any, *args: Any, _frames_up: int = 0, **kwargs: Any) -> Any:
        # One frame more than the caller's: script() resolves names in the caller's frame.
        if isinstance(obj, module_cls):
            with _lifted(obj):
                return original_script(obj, *args, _frames_up=_frames_up + 1, **kwargs)
        return original_script(obj, *args, _frames_up=_frames_up + 1, **kwargs)

    functools.update_wrapper(script, original_script)
    hooks.patch(torch.jit, "script", script)

    skip_own_frames(__getstate__, script)


def skip_frames(*functions: Any) -> None:
    """Have Dynamo's frame evaluation run these functions, and all they call, as plain Python.
    Inlining them inside a traced region is unaffected (they trace to a no-op)."""
    _set_strategy(functions, recursive=True)


def skip_own_frames(*functions: Any) -> None:
    """Have Dynamo's frame evaluation run these wrappers as plain Python, and treat what they
    call as it would without them (as it treats torch's own functions)."""
    _set_strategy(functions, recursive=False)


def _set_strategy(functions: tuple[Any, ...], recursive: bool) -> None:
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )
    except ImportError:  # a torch without per-code strategies: hooks still no-op when traced
        return
    inner = _FrameAction.SKIP if recursive else _FrameAction.DEFAULT
    strategy = _FrameExecStrategy(_FrameAction.SKIP, inner)
    for fn in functions:
        code = _code_of(fn)
        if code is not None:
            set_code_exec_strategy(code, strategy)


def _code_of(fn: Any) -> Any:
    return getattr(getattr(fn, "__func__", fn), "__code__", None)


def compile_in_use(torch: Any) -> bool:
    """Whether Dynamo has compiled anything in this process (without importing it)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return False
    try:
        return bool(utils.counters["frames"]["total"])
    except Exception:
        return False
