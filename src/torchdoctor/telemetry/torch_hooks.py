"""The patches and hooks that feed the Recorder: thin adapters, one per place torch is
entered. Each one, in this order:

1. returns at once while Dynamo traces it (it then traces to a no-op: no graph break, no
   guard) or while a tracer runs the model (torch.jit.trace, torch.export);
2. returns at once when the telemetry is off, or on a thread other than the training one;
3. calls the Recorder behind a guard: an exception switches the telemetry off, never the
   training.

Dynamo's frame evaluation runs every function here as plain Python (see `invisible`): the
hooks and everything they call (`skip_frames`); the wrappers around torch functions only
themselves (`skip_own_frames`): what the wrapped function calls is treated as it would be
without us, and the wrapper reaches the Recorder through `_guarded`, which is skipped with all
it calls. Every patch and handle is kept in the Recorder's `Hooks`.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from torchdoctor.frames import site, user_frame
from torchdoctor.telemetry import invisible
from torchdoctor.telemetry.invisible import (
    compiling,
    dynamo_compiling,
    export_flags,
    jit_tracing_state,
    tracing,
)
from torchdoctor.telemetry.patches import Hooks

_get_ident = threading.get_ident
_now = time.perf_counter


def is_zero(threshold: Any) -> bool:
    """A clip threshold that is exactly 0: a Python number, or a 0-d CPU tensor (a GPU one
    is not read: that would wait for the device)."""
    if isinstance(threshold, (int, float)) and not isinstance(threshold, bool):
        return threshold == 0
    shape = getattr(threshold, "shape", None)
    device = getattr(threshold, "device", None)
    if shape == () and getattr(device, "type", None) == "cpu":
        return bool(threshold == 0)
    return False


def _guarded(rec: Any, method: Any, *args: Any) -> None:
    """Call into the Recorder; an exception switches the telemetry off, not the training."""
    try:
        method(*args)
    except Exception as exc:
        rec.switch.fail(exc)


def install(rec: Any, torch: Any, hooks: Hooks) -> Callable[[], None]:
    """Patch torch and hook it; what swaps the compiled hooks for their Python twins."""
    switch = rec.switch
    updates = rec.updates
    fast = rec.steady_handlers  # a steady step's events (steady.py), or None: never steady

    def on_train_thread() -> bool:
        return switch.on and _get_ident() == rec.train_thread

    # -- backward --------------------------------------------------------------------------
    original_backward = torch.autograd.backward

    # backward() and next(loader) run every step: their guards are written inline (each
    # helper call is a frame more on every step of a small model).
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if (
            dynamo_compiling()  # compiling(), inline (invisible.py)
            or export_flags._is_compiling_flag
            or not switch.on
            or _get_ident() != rec.train_thread
        ):
            return original_backward(tensors, *args, **kwargs)
        try:
            if fast is None or not fast.backward(tensors):
                rec.on_backward(tensors, _now(), sys._getframe(1))
        except Exception as exc:
            switch.fail(exc)
        try:
            return original_backward(tensors, *args, **kwargs)
        finally:
            if switch.on:
                try:
                    if fast is None or not fast.backward_done():
                        rec.on_backward_done(_now())
                except Exception as exc:
                    switch.fail(exc)

    backward.__wrapped__ = original_backward  # type: ignore[attr-defined]
    # Where no torch.compile is in use, torch.autograd.backward is backward's compiled twin
    # (native/steady.cpp's Backward: no Python frame, none in a traceback either)
    native = fast is not None and not rec.compiled
    compiled_backward = fast.wrap_backward(original_backward) if native else backward
    hooks.patch(torch.autograd, "backward", compiled_backward)

    # -- optimizers (global step hooks: every optimizer, no per-instance state) ----------------
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    # optimizer.step() calls so far, counted by the hook torch calls (the compiled one counts
    # its own): GradScaler.step compares the count to see a step it skipped
    python_calls = 0

    def step_calls() -> int:
        return python_calls + (fast.optimizer_calls if fast is not None else 0)

    # The hooks Dynamo skips with all they call guard inline: one frame less per step.
    def optimizer_pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        nonlocal python_calls
        if dynamo_compiling() or export_flags._is_compiling_flag:
            return
        python_calls += 1  # counted with the switch off too
        if switch.on:
            try:
                if fast is None or not fast.optimizer_pre(optimizer):
                    updates.begin(optimizer, _now())
            except Exception as exc:
                switch.fail(exc)

    def optimizer_post(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not (dynamo_compiling() or export_flags._is_compiling_flag) and switch.on:
            try:
                if fast is None or not fast.optimizer_post(optimizer):
                    updates.end(optimizer, _now())
            except Exception as exc:
                switch.fail(exc)

    # Where no torch.compile is in use, torch calls the compiled twins of these two (no Python
    # frame a step); at the first torch.compile they are swapped in place (Dynamo cannot trace
    # a builtin, and traces these to nothing).
    pre_handle = hooks.handle(
        register_optimizer_step_pre_hook(fast.optimizer_pre_hook if native else optimizer_pre)
    )
    post_handle = hooks.handle(
        register_optimizer_step_post_hook(fast.optimizer_post_hook if native else optimizer_post)
    )

    def python_twins() -> None:
        hooks.replace(pre_handle, optimizer_pre)
        hooks.replace(post_handle, optimizer_post)
        if torch.autograd.backward is compiled_backward:  # ours still, not a later patch
            torch.autograd.backward = backward

    # -- DataLoader ----------------------------------------------------------------------------
    from torch.utils.data import dataloader as dl

    base = dl._BaseDataLoaderIter
    original_next = base.__dict__["__next__"]

    def __next__(it: Any) -> Any:
        if (
            dynamo_compiling()
            or export_flags._is_compiling_flag
            or not switch.on
            or _get_ident() != rec.train_thread
        ):
            return original_next(it)
        try:
            rec.on_data(_now())
        except Exception as exc:
            switch.fail(exc)
        try:
            return original_next(it)
        finally:
            if switch.on:
                try:
                    rec.on_data_done(_now())
                except Exception as exc:
                    switch.fail(exc)

    hooks.patch(base, "__next__", __next__)
    seen: set[int] = set()
    original_iter = dl.DataLoader.__dict__["__iter__"]

    def __iter__(loader: Any) -> Any:
        it = original_iter(loader)
        if not compiling() and switch.on and id(loader) not in seen:
            seen.add(id(loader))
            facts = _loader_facts(loader)
            facts["site"] = site(user_frame(sys._getframe(1)))  # where it is iterated
            _guarded(rec, rec.event, "dataloader", facts)
        return it

    hooks.patch(dl.DataLoader, "__iter__", __iter__)

    # -- GradScaler: the unscaled loss, and steps it skips --------------------------------------
    scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
    scaler_fns: list[Any] = []
    if scaler_cls is not None:
        original_scale = scaler_cls.__dict__["scale"]
        original_step = scaler_cls.__dict__["step"]

        def scale(scaler: Any, outputs: Any) -> Any:
            result = original_scale(scaler, outputs)
            if not compiling() and on_train_thread() and isinstance(outputs, torch.Tensor):
                _guarded(rec, rec.on_scale, result, outputs)
            return result

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original_step(scaler, optimizer, *args, **kwargs)
            before = step_calls()
            out = original_step(scaler, optimizer, *args, **kwargs)
            if switch.on and step_calls() == before:
                _guarded(rec, updates.skipped, optimizer, _now())
            return out

        hooks.patch(scaler_cls, "scale", scale)
        hooks.patch(scaler_cls, "step", step)
        scaler_fns = [scale, step]

    # -- clip_grad_norm_: its total norm is the one we would compute -------------------------
    # Both clips: a threshold of 0 sets every gradient to 0 (said once per function).
    utils = torch.nn.utils
    original_clip = utils.clip_grad_norm_
    original_clip_value = utils.clip_grad_value_
    zero_clips: set[str] = set()

    def clip_at_zero(name: str, threshold: Any) -> None:
        if name not in zero_clips and is_zero(threshold):
            zero_clips.add(name)
            data = {"function": name, "threshold": float(threshold)}
            data["site"] = site(user_frame(sys._getframe(2)))
            rec.event("clip_to_zero", data)

    def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
        norm = original_clip(*args, **kwargs)
        if not compiling() and on_train_thread():
            _guarded(rec, rec.on_clip, norm)
            max_norm = kwargs.get("max_norm", args[1] if len(args) > 1 else None)
            _guarded(rec, clip_at_zero, "clip_grad_norm_", max_norm)
        return norm

    def clip_grad_value_(*args: Any, **kwargs: Any) -> Any:
        out = original_clip_value(*args, **kwargs)
        if not compiling() and on_train_thread():
            value = kwargs.get("clip_value", args[1] if len(args) > 1 else None)
            _guarded(rec, clip_at_zero, "clip_grad_value_", value)
        return out

    clip_grad_norm_.__wrapped__ = original_clip  # type: ignore[attr-defined]
    clip_grad_value_.__wrapped__ = original_clip_value  # type: ignore[attr-defined]
    hooks.patch(utils, "clip_grad_norm_", clip_grad_norm_)
    hooks.patch(utils, "clip_grad_value_", clip_grad_value_)

    # -- torch.compile: from its first call on, no global module hooks ---------------------------
    original_compile = torch.compile

    def compile(*args: Any, **kwargs: Any) -> Any:
        if not compiling() and switch.on:
            _guarded(rec, rec.on_compile)
        return original_compile(*args, **kwargs)

    compile.__wrapped__ = original_compile  # type: ignore[attr-defined]
    compile.__doc__ = original_compile.__doc__
    hooks.patch(torch, "compile", compile)

    # -- torch.export: a strict export traces the models' hooks with Dynamo ---------------------
    export_module = getattr(torch, "export", None)
    original_export = getattr(export_module, "export", None)
    export_fns: list[Any] = []
    if fast is not None and original_export is not None:

        def export(*args: Any, **kwargs: Any) -> Any:
            if not compiling():
                _guarded(rec, rec.use_python_hooks)  # Dynamo cannot trace a compiled hook
            return original_export(*args, **kwargs)

        functools.update_wrapper(export, original_export)
        hooks.patch(export_module, "export", export)
        export_fns.append(export)

    invisible.install(torch, hooks)
    invisible.skip_frames(
        _guarded,
        # called inline (not through _guarded) by the wrappers below: plain Python too
        rec.on_backward,
        rec.on_backward_done,
        rec.on_data,
        rec.on_data_done,
        optimizer_pre,
        optimizer_post,
        *rec.python_model_hook,  # model_hooks' closures
        global_pre,
        global_post,
    )
    invisible.skip_own_frames(
        backward,
        __next__,
        __iter__,
        clip_grad_norm_,
        clip_grad_value_,
        compile,
        on_train_thread,
        *scaler_fns,
        *export_fns,
    )
    return python_twins


class ModelHooks(NamedTuple):
    """The hooks put on each root module: a model gets `pre` (its forward pre-hook: the
    forward phase opens) and `post` (its forward hook: it closes); a root without parameters
    (a loss module) gets `loss` (its calls are kept for a NaN replay, in no phase). Each is
    one call layer: a model's run every step."""

    pre: invisible.ModelHook
    post: invisible.ModelHook
    loss: invisible.ModelHook


def compiled_model_hooks(rec: Any, python: ModelHooks) -> ModelHooks:
    """The model hooks torch calls while no torch.compile is in use: the compiled twins of
    `python`'s pre and post (native/steady.cpp: no Python frame a call), where built."""
    fast = rec.steady_handlers
    if fast is None:
        return python
    return python._replace(pre=fast.pre_hook, post=fast.post_hook)


def model_hooks(rec: Any) -> ModelHooks:
    switch, on_model_call, on_model_return = rec.switch, rec.on_model_call, rec.on_model_return
    plan = rec.plan
    fast = rec.steady_handlers  # steady.py

    def model_call(module: Any, args: Any, kwargs: Any) -> None:
        if (
            dynamo_compiling()  # tracing(), inline (invisible.py)
            or export_flags._is_compiling_flag
            or jit_tracing_state() is not None
            or not switch.on
            or _get_ident() != rec.train_thread
        ):
            return
        try:
            if fast is None or not fast.model_call(module, args, kwargs):
                on_model_call(module, args, kwargs)
        except Exception as exc:
            switch.fail(exc)

    def model_return(module: Any, args: Any, output: Any) -> None:
        # plan.depth: a model called inside a model while the global hooks are on (they ran
        # first, so a top-level call is back at 0 here). compiling() alone (inline), not
        # tracing(): under torch.jit.trace the pre-hook opened nothing, so there is nothing to
        # close.
        if (
            dynamo_compiling()
            or export_flags._is_compiling_flag
            or not switch.on
            or _get_ident() != rec.train_thread
            or plan.depth
        ):
            return
        try:
            if fast is None:
                on_model_return(_now())
            else:
                fast.model_return()  # the same, without a Python frame
        except Exception as exc:
            switch.fail(exc)

    def loss_call(module: Any, args: Any, kwargs: Any) -> None:
        if tracing() or not switch.on or _get_ident() != rec.train_thread:
            return
        try:
            rec.on_loss_call(module, args, kwargs)
        except Exception as exc:
            switch.fail(exc)

    return ModelHooks(
        invisible.model_hook(model_call),
        invisible.model_hook(model_return),
        invisible.model_hook(loss_call),
    )


def global_pre(plan: Any, module: Any, args: Any) -> None:
    rec = plan.rec
    if tracing() or not rec.switch.on or _get_ident() != rec.train_thread:
        return
    _guarded(rec, plan.on_global_pre, module, args)


def global_post(plan: Any, module: Any, args: Any, output: Any) -> None:
    rec = plan.rec
    if tracing() or not rec.switch.on or _get_ident() != rec.train_thread:
        return
    _guarded(rec, plan.on_global_post, module, output)


def add_global_module_hooks(plan: Any, hooks: Hooks) -> None:
    """Hooks on every module call (telemetry/trace_plan.py: the discovery step and traced
    steps)."""
    from torch.nn.modules.module import (
        register_module_forward_hook,
        register_module_forward_pre_hook,
    )

    hooks.handle(register_module_forward_pre_hook(functools.partial(global_pre, plan)))
    hooks.handle(
        register_module_forward_hook(functools.partial(global_post, plan), always_call=True)
    )


def _loader_facts(loader: Any) -> dict[str, Any]:
    """What the `dataloader` event says of a DataLoader (dataloader_bound reads it)."""
    return {
        "num_workers": getattr(loader, "num_workers", None),
        "pin_memory": getattr(loader, "pin_memory", None),
        "persistent_workers": getattr(loader, "persistent_workers", None),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "batch_size": getattr(loader, "batch_size", None),
        "dataset": type(getattr(loader, "dataset", None)).__name__,
        "sampler": type(getattr(loader, "sampler", None)).__name__,
        "batches": _length(loader),
    }


def _length(loader: Any) -> int | None:
    """Batches per epoch, where the loader knows it (not for an IterableDataset)."""
    try:
        return len(loader)
    except Exception:
        return None
