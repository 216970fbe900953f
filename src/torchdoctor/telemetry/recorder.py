"""Training telemetry with no code changes: one python.steps row per optimizer step.

Where each phase is measured:
  data_wait  DataLoader iterators' __next__ (patched on the base iterator class)
  forward    calls of the models (instance hooks on the outermost modules only)
  backward   torch.autograd.backward (which Tensor.backward calls)
  optimizer  global optimizer step pre/post hooks
  other      the rest of the step (zero_grad, logging, your own code)

The first step finds the models with global module hooks, then those are replaced by hooks on
the models alone; global hooks return only on traced steps (one in `trace_every`). Every hook
body runs behind a switch that an exception turns off (the training goes on), and every hook
is removed by `remove()`.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import weakref
from typing import Any

from torchdoctor._guard import Switch, warn_once
from torchdoctor._json import dumps
from torchdoctor.telemetry import gradients
from torchdoctor.telemetry.clock import CpuClock, CudaClock
from torchdoctor.telemetry.memory import MemoryReader
from torchdoctor.telemetry.models import Models
from torchdoctor.telemetry.patches import Hooks
from torchdoctor.telemetry.readback import Readback
from torchdoctor.telemetry.tracer import Tracer

TAPE_LIMIT = 8  # root-module calls kept per step for a NaN replay


class StepState:
    """What the step in progress has gathered so far."""

    __slots__ = (
        "autocast",
        "backward",
        "backward_site",
        "clip_norm",
        "data_wait",
        "forward",
        "loss_ref",
        "losses",
        "micro",
        "nonfinite_seen",
        "optimizer",
        "rng",
        "start",
        "tape",
    )

    def __init__(self, start: float | None) -> None:
        self.start = start  # None until the first step's first activity
        self.data_wait = 0.0
        self.forward = 0.0
        self.backward = 0.0
        self.optimizer = 0.0
        self.losses: list[Any] = []
        self.loss_ref: Any = None  # the tensor backward() ran on (its graph names the loss ops)
        self.backward_site: tuple[str, int] | None = None  # where backward() was called
        self.nonfinite_seen = False
        self.micro = 0
        self.clip_norm: Any = None
        self.tape: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self.rng: Any = None
        self.autocast: list[tuple[str, Any]] = []  # autocast contexts active at the model call


class Recorder:
    def __init__(self, session: Any) -> None:
        import torch

        self.torch = torch
        self.session = session
        self.tables = session.tables
        self.switch = Switch("torchdoctor telemetry")
        self.hooks = Hooks()
        self._root_hooks = Hooks()
        self._global_hooks = Hooks()
        self.memory = MemoryReader(torch)
        self.models = Models()
        self.tracer = Tracer(self)
        self.clock: Any = CpuClock()
        self.step = 0  # the step in progress
        self.steps_done = 0
        self.state = StepState(None)
        self._last_row: tuple[Any, ...] | None = None
        self.rank = _rank_from_env()
        self.train_thread = threading.main_thread().ident
        self.tracing = False
        self.discovering = True
        self.phase = "other"  # data, forward, backward, optimizer or other: what runs now
        self.sync_check = False
        # Keep the random state per step only for models that draw random numbers (dropout):
        # a NaN replay must see the same masks. Until the models are known, keep it.
        self._random = True
        self._random_known = False
        self._norm_plan = gradients.NormPlan()
        self._trace_requested = (
            False  # CUDA: read the gradient norm before the update (after a NaN)
        )
        self.nonfinite_steps = 0
        self.skipped_steps = 0
        self.on_nonfinite: list[Any] = []  # callbacks(recorder, info) before the update
        self._primary: Any = None
        self._opt_t0 = 0.0
        self._fwd_t0: float | None = None  # start of the open forward segment
        self._gdepth = 0  # nesting of module calls, while global hooks are on
        self._pending_roots: list[Any] = []
        self._scaled: tuple[Any, Any] | None = None
        self._optimizer_calls = 0
        self._setup_memory_done = False
        self.readback = Readback(torch)

    # -- install / remove ------------------------------------------------------------------
    def install(self) -> None:
        torch = self.torch
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        self.hooks.handle(register_optimizer_step_pre_hook(self._opt_pre))
        self.hooks.handle(register_optimizer_step_post_hook(self._opt_post))
        self._patch_backward(torch)
        self._patch_dataloader(torch)
        self._patch_scaler(torch)
        self._patch_clip(torch)
        self._set_global_hooks(True)
        from torchdoctor.telemetry.nan_replay import NanLocalizer

        NanLocalizer(self)
        self.hooks.on_remove(self._root_hooks.remove)
        self.hooks.on_remove(lambda: self._set_global_hooks(False))
        self.memory.start()
        self.hooks.on_remove(self.memory.close)

    def remove(self) -> None:
        try:
            self.readback.poll(force=True)
            self.tracer.flush(force=True)
        except Exception as exc:
            warn_once("final-flush", f"could not read back the last steps: {exc}")
        self.switch.on = False
        self.hooks.remove()

    def disable_in_child(self) -> None:
        self.switch.on = False

    def _set_global_hooks(self, on: bool) -> None:
        self._gdepth = 0
        if on and not len(self._global_hooks):
            from torch.nn.modules.module import (
                register_module_forward_hook,
                register_module_forward_pre_hook,
            )

            self._global_hooks.handle(register_module_forward_pre_hook(self._g_pre))
            self._global_hooks.handle(register_module_forward_hook(self._g_post, always_call=True))
        elif not on:
            self._global_hooks.remove()

    # -- patches -----------------------------------------------------------------------------
    def _patch_backward(self, torch: Any) -> None:
        original = torch.autograd.backward
        rec = self

        def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            if not rec.switch.on or threading.get_ident() != rec.train_thread:
                return original(tensors, *args, **kwargs)
            t0 = time.perf_counter()
            rec._forward_ends(t0)
            rec._before_backward(tensors)
            rec.phase = "backward"
            try:
                return original(tensors, *args, **kwargs)
            finally:
                rec.phase = "other"
                rec._after_backward(t0)

        backward.__wrapped__ = original  # type: ignore[attr-defined]
        self.hooks.patch(torch.autograd, "backward", backward)

    def _patch_dataloader(self, torch: Any) -> None:
        from torch.utils.data import dataloader as dl

        base = dl._BaseDataLoaderIter
        original_next = base.__dict__["__next__"]
        rec = self

        def __next__(it: Any) -> Any:
            if not rec.switch.on:
                return original_next(it)
            t0 = time.perf_counter()
            rec._forward_ends(t0)
            rec.phase = "data"
            try:
                return original_next(it)
            finally:
                rec.phase = "other"
                if threading.get_ident() == rec.train_thread:
                    state = rec.state
                    state.data_wait += time.perf_counter() - t0
                    if state.start is None:
                        state.start = t0

        self.hooks.patch(base, "__next__", __next__)
        seen: set[int] = set()
        original_iter = dl.DataLoader.__dict__["__iter__"]

        def __iter__(loader: Any) -> Any:
            it = original_iter(loader)
            if rec.switch.on and id(loader) not in seen:
                seen.add(id(loader))
                rec._loader_seen(loader)
            return it

        self.hooks.patch(dl.DataLoader, "__iter__", __iter__)

    def _patch_scaler(self, torch: Any) -> None:
        scaler_cls = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler_cls is None:
            return
        rec = self
        original_scale = scaler_cls.__dict__["scale"]
        original_step = scaler_cls.__dict__["step"]

        def scale(scaler: Any, outputs: Any) -> Any:
            result = original_scale(scaler, outputs)
            if rec.switch.on and isinstance(outputs, torch.Tensor):
                rec._scaled = (result, outputs)  # backward(result) reports `outputs`
            return result

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            before = rec._optimizer_calls
            out = original_step(scaler, optimizer, *args, **kwargs)
            if rec.switch.on and rec._optimizer_calls == before:
                rec._scaler_skipped(optimizer)  # inf/NaN gradients: GradScaler skipped the step
            return out

        self.hooks.patch(scaler_cls, "scale", scale)
        self.hooks.patch(scaler_cls, "step", step)

    def _patch_clip(self, torch: Any) -> None:
        utils = torch.nn.utils
        original = utils.clip_grad_norm_
        rec = self

        def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
            norm = original(*args, **kwargs)
            if rec.switch.on and threading.get_ident() == rec.train_thread:
                rec.state.clip_norm = norm  # the total norm before clipping: no need to recompute
            return norm

        clip_grad_norm_.__wrapped__ = original  # type: ignore[attr-defined]
        self.hooks.patch(utils, "clip_grad_norm_", clip_grad_norm_)

    # -- module hooks ------------------------------------------------------------------------
    # Forward time is a segment that opens at a model call and closes when backward starts
    # (or at the next data fetch, optimizer step or step end): the forward pass and the loss.
    # Known models carry one pre-hook each; no post-hook, so the call stays cheap.
    def _g_pre(self, module: Any, args: Any) -> None:
        if not self.switch.on or threading.get_ident() != self.train_thread:
            return
        try:
            top = self._gdepth == 0
            self._gdepth += 1
            if top and not self.models.is_root(module):
                self._forward_begins(module, args, {})
                if self.models.add(module):
                    self._pending_roots.append(module)
            if self.tracing:
                self.tracer.enter(module, self.models.name_of(module), time.time())
        except Exception as exc:
            self.switch.fail(exc)

    def _g_post(self, module: Any, args: Any, output: Any) -> None:
        if not self.switch.on or threading.get_ident() != self.train_thread:
            return
        try:
            self._gdepth = max(0, self._gdepth - 1)
            if self.tracing:
                self.tracer.exit(module, output)
        except Exception as exc:
            self.switch.fail(exc)

    def _root_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if not self.switch.on or threading.get_ident() != self.train_thread:
            return
        if self._gdepth > 1:
            return  # a model called inside another model (global hooks tell us so)
        self._forward_begins(module, args, kwargs)

    def _forward_begins(self, module: Any, args: Any, kwargs: Any) -> None:
        state = self.state
        if not self._setup_memory_done:
            self._setup_memory_done = True
            self._memory_row("setup")
            if self.memory.on_cuda():  # allocator history from the first step, not the second
                self.session.on_cuda_detected()
        if not state.tape:
            if self._random:
                state.rng = self.torch.get_rng_state()  # a NaN replay draws the same numbers
            state.autocast = _autocast_now(self.torch)  # and runs in the same precision
        if len(state.tape) < TAPE_LIMIT:
            state.tape.append((module, args, kwargs))
        if self._fwd_t0 is None:
            self._fwd_t0 = time.perf_counter()
            if state.start is None:
                state.start = self._fwd_t0
        self.phase = "forward"

    def _forward_ends(self, now: float) -> None:
        if self._fwd_t0 is not None:
            self.state.forward += now - self._fwd_t0
            self._fwd_t0 = None
            self.phase = "other"

    def _hook_roots(self, modules: list[Any]) -> None:
        for module in modules:
            self._root_hooks.handle(
                module.register_forward_pre_hook(self._root_pre, with_kwargs=True)
            )
            self._random = self._random or _has_randomness(module)
            for root, label in self.models.models():
                if root is module:
                    self.tables["modules"].extend(self.models.module_rows(module, label))
                    self.event("model", {"name": label, "type": type(module).__name__})

    # -- backward ----------------------------------------------------------------------------
    def _before_backward(self, tensors: Any) -> None:
        loss = tensors
        if isinstance(loss, (tuple, list)):
            loss = loss[0] if len(loss) == 1 else None
        if loss is None or not isinstance(loss, self.torch.Tensor) or loss.numel() != 1:
            return
        scaled = self._scaled
        if scaled is not None and scaled[0] is loss:
            loss = scaled[1]
        state = self.state
        if self.tracing:
            self._memory_row("forward")
        state.loss_ref = loss
        state.backward_site = _caller_site()
        state.losses.append(loss.detach() if self.clock.cuda else loss.item())

    def _after_backward(self, t0: float) -> None:
        state = self.state
        state.backward += time.perf_counter() - t0
        state.micro += 1
        if self.tracing:
            self._memory_row("backward")
        last = state.losses[-1] if state.losses else None
        if isinstance(last, float) and not math.isfinite(last):
            # Caught here too, for loops that skip optimizer.step() on a bad loss.
            self._nonfinite({"step": self.step, "grad_norm": None, "losses": [last]})

    # -- optimizer ---------------------------------------------------------------------------
    @property
    def primary(self) -> Any:
        return self._primary() if self._primary is not None else None

    def _adopt(self, optimizer: Any) -> None:
        """The optimizer whose steps are the rows of python.steps (held weakly)."""
        self._primary = weakref.ref(optimizer)

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        self._optimizer_calls += 1
        if not self.switch.on:
            return None
        self._opt_t0 = time.perf_counter()
        self._forward_ends(self._opt_t0)
        self.phase = "optimizer"
        try:
            if self.primary is None:
                self._adopt(optimizer)
                self.train_thread = threading.get_ident()
            if optimizer is self.primary:
                # args: (optimizer, closure?) as torch passes them to the hooks
                closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
                if callable(closure):
                    return self._check_after(closure, optimizer, args, kwargs)
                self._check_gradients(optimizer)
        except Exception as exc:
            self.switch.fail(exc)
        return None

    def _check_after(self, closure: Any, optimizer: Any, args: Any, kwargs: Any) -> Any:
        """step(closure) (LBFGS, Lightning): the closure runs forward and backward inside the
        step, so the gradients are checked when it returns, and its time is not optimizer time."""
        rec = self

        def closure_then_check() -> Any:
            t0 = time.perf_counter()
            out = closure()
            rec._opt_t0 += time.perf_counter() - t0
            rec.phase = "optimizer"
            if rec.switch.on:
                try:
                    rec._check_gradients(optimizer)
                except Exception as exc:
                    rec.switch.fail(exc)
            return out

        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_check}
        return (args[0], closure_then_check, *args[2:]), kwargs

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.switch.on:
            return
        now = time.perf_counter()
        self.phase = "other"
        self.state.optimizer += now - self._opt_t0
        if optimizer is not self.primary:
            return
        try:
            if self.tracing:
                self._memory_row("optimizer")
            self._end_step(now, skipped=self._skip_this_step)
        except Exception as exc:
            self.switch.fail(exc)

    _skip_this_step = False
    _grad_norm: Any = None
    _grad_norm_value: float | None = None

    def _check_gradients(self, optimizer: Any) -> None:
        params, grads = gradients.collect(optimizer)
        state = self.state
        if state.clip_norm is not None:
            norm = state.clip_norm
        elif grads:
            norm = self._norm_plan(self.torch, grads)
        else:
            norm = None
        self._grad_norm = norm
        self._grad_norm_value = None
        self._skip_this_step = False
        if self.tracing:
            self._module_grads(optimizer)
        if norm is None:
            return
        if self.clock.cuda and not self.session.config.guard and not self.sync_check:
            return  # read back later with the step row: no sync here
        value = float(norm)
        if not math.isfinite(value) and gradients.all_finite(self.torch, grads):
            # Finite gradients whose squares overflow float32: not a NaN, a huge norm.
            self._grad_norm = gradients.total_norm(self.torch, grads, dtype=self.torch.float64)
            value = float(self._grad_norm)
        self._grad_norm_value = value
        if math.isfinite(value) and all(math.isfinite(v) for v in state.losses):
            return
        self._nonfinite(
            {"step": self.step, "grad_norm": value, "losses": list(state.losses), "params": params}
        )
        if self.session.config.guard and not math.isfinite(value):
            for p in params:
                p.grad = None  # the optimizer skips parameters without a gradient
            self._skip_this_step = True
            self.event("guard_skip", {"grad_norm": _jsonable(value)})

    def _nonfinite(self, info: dict[str, Any], once_per_step: bool = True) -> None:
        """A step went non-finite: run the localizers (before the update, when on time)."""
        state = self.state
        if once_per_step:
            if state.nonfinite_seen:
                return
            state.nonfinite_seen = True
        self.nonfinite_steps += 1
        for callback in list(self.on_nonfinite):
            try:
                callback(self, info)
            except Exception as exc:
                warn_once("nan-callback", f"NaN localization failed: {type(exc).__name__}: {exc}")

    def _module_grads(self, optimizer: Any) -> None:
        """Per-module gradient and weight norms (traced steps), read back without a sync."""
        by_module: dict[str, list[Any]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                named = self.models.param_name(p)
                by_module.setdefault(named[0] if named else "?", []).append(p)
        names = list(by_module)
        with_grad = [[p for p in by_module[n] if p.grad is not None] for n in names]
        flat_grads = [p.grad for ps in with_grad for p in ps]
        flat_params = [p for n in names for p in by_module[n]]
        values = gradients.norm_tensor(self.torch, flat_grads + flat_params)
        if values is None:
            return
        step, rank = self.step, self.rank

        def done(norms: list[float]) -> None:
            gnorms, pnorms = iter(norms[: len(flat_grads)]), iter(norms[len(flat_grads) :])
            rows = []
            for name, gs in zip(names, with_grad, strict=True):
                ps = by_module[name]
                g2 = sum(next(gnorms) ** 2 for _ in gs)
                p2 = sum(next(pnorms) ** 2 for _ in ps)
                trainable = sum(1 for p in ps if p.requires_grad)
                grad_norm = math.sqrt(g2) if gs else None
                rows.append((step, name, grad_norm, math.sqrt(p2), len(gs), trainable, rank))
            self.tables["module_grads"].extend(rows)

        self.readback.submit(values, done)

    def _scaler_skipped(self, optimizer: Any) -> None:
        if self.primary is None:
            self._adopt(optimizer)
        if optimizer is self.primary:
            self._end_step(time.perf_counter(), skipped=True)

    # -- step boundary -----------------------------------------------------------------------
    def manual_step(self, loss: Any = None) -> None:
        """torchdoctor.step(): the end of a step in a loop without torch.optim."""
        if not self.switch.on:
            return
        if loss is not None and not self.state.losses:
            self._before_backward(loss)
        self._end_step(time.perf_counter(), skipped=False)

    def _end_step(self, now: float, skipped: bool) -> None:
        self._forward_ends(now)
        state = self.state
        if self.tracing:
            self.tracer.end(self.clock.mark())
        allocated, peak, reserved, rss = self.memory.read()
        duration = max(0.0, now - (state.start if state.start is not None else now))
        phases = state.data_wait + state.forward + state.backward + state.optimizer
        row = [
            self.step,
            time.time(),
            duration,
            state.data_wait,
            state.forward,
            state.backward,
            state.optimizer,
            max(0.0, duration - phases),
            None,  # loss, filled by _emit
            None,  # grad_norm, filled by _emit
            self._lr(),
            allocated,
            peak,
            reserved,
            rss,
            self.rank,
            state.micro,
            skipped,
            self.tracing,
        ]
        self._emit(row, state.losses, self._grad_norm)
        if skipped:
            self.skipped_steps += 1
        self.step += 1
        self.steps_done += 1
        self._grad_norm = None
        self._grad_norm_value = None
        self._skip_this_step = False
        self._scaled = None
        self.state = StepState(time.perf_counter())
        self._after_step()

    _LOSS, _NORM = 8, 9

    def _emit(self, row: list[Any], losses: list[Any], norm: Any) -> None:
        """Append the step row. On CUDA, loss and gradient norm are read back asynchronously and
        the row waits until they have landed: no sync per step."""
        if not self.clock.cuda:
            row[self._LOSS] = sum(losses) / len(losses) if losses else None
            value = self._grad_norm_value
            row[self._NORM] = value if value is not None or norm is None else float(norm)
            self._append_step(row)
            return
        torch = self.torch
        device = torch.device("cuda", torch.cuda.current_device())
        nan = torch.full((), float("nan"), device=device)
        loss = torch.stack([v.float().reshape(()) for v in losses]).mean() if losses else nan
        value = norm.float().reshape(()).to(device) if norm is not None else nan
        has_loss, has_norm = bool(losses), norm is not None

        def done(values: list[float]) -> None:
            loss_value, norm_value = values
            row[self._LOSS] = loss_value if has_loss else None
            row[self._NORM] = norm_value if has_norm else None
            self._append_step(row)
            bad_loss = has_loss and not math.isfinite(loss_value)
            if bad_loss or (has_norm and not math.isfinite(norm_value)):
                late = {"step": row[0], "grad_norm": norm_value, "losses": [loss_value]}
                self._nonfinite(dict(late, late=True), once_per_step=False)

        self.readback.submit(torch.stack([loss, value]), done)
        self.readback.poll()

    def _append_step(self, row: list[Any]) -> None:
        self._last_row = tuple(row)
        self.tables["steps"].append(self._last_row)

    @property
    def last(self) -> dict[str, Any]:
        """The latest step row's headline numbers (for the status line and `list`)."""
        row = self._last_row
        if row is None:
            return {}
        return {
            "step": row[0],
            "time": row[1],
            "duration": row[2],
            "data_wait": row[3],
            "loss": row[self._LOSS],
            "allocated": row[11],
        }

    def _after_step(self) -> None:
        if self._pending_roots:
            roots, self._pending_roots = self._pending_roots, []
            if not self._random_known:
                self._random, self._random_known = False, True
            self._hook_roots(roots)
        if self.discovering:
            self.discovering = False
            self.clock = CudaClock(self.torch) if self.memory.on_cuda() else CpuClock()
            if self.clock.cuda:
                self.memory.device = self.torch.cuda.current_device()
                self.session.on_cuda_detected()
        if self.tracer.pending:
            self.tracer.flush()
        every = self.session.config.trace_every
        tracing = self._trace_requested or (bool(every) and (every == 1 or self.step % every == 1))
        self._trace_requested = False
        if tracing:
            self.tracer.begin(self.step, self.clock)
        if tracing != bool(len(self._global_hooks)):  # on for discovery and traced steps only
            self._set_global_hooks(tracing)
        self.tracing = tracing

    # -- helpers -----------------------------------------------------------------------------
    def _lr(self) -> float | None:
        opt = self.primary
        try:
            lr = opt.param_groups[0]["lr"] if opt is not None else None
        except (AttributeError, IndexError, KeyError):
            return None
        if isinstance(lr, (int, float)):
            return float(lr)
        if isinstance(lr, self.torch.Tensor) and lr.device.type == "cpu":
            return float(lr)
        return None

    def _memory_row(self, phase: str) -> None:
        allocated, peak, reserved, _rss = self.memory.read_now()
        self.tables["memory"].append(
            (self.step, phase, allocated, peak, reserved, time.time(), self.rank)
        )

    def _loader_seen(self, loader: Any) -> None:
        self.event(
            "dataloader",
            {
                "num_workers": getattr(loader, "num_workers", None),
                "pin_memory": getattr(loader, "pin_memory", None),
                "persistent_workers": getattr(loader, "persistent_workers", None),
                "prefetch_factor": getattr(loader, "prefetch_factor", None),
                "batch_size": getattr(loader, "batch_size", None),
                "dataset": type(getattr(loader, "dataset", None)).__name__,
            },
        )

    def event(self, kind: str, data: dict[str, Any]) -> None:
        self.tables["events"].append((time.time(), self.step, kind, dumps(data)))

    def watch(self, model: Any, optimizer: Any = None, name: str | None = None) -> None:
        if self.models.add(model, name):
            self._hook_roots([model])
        if optimizer is not None:
            self._adopt(optimizer)
            self._named = True

    _named = False  # watch() named the primary optimizer: rediscover() keeps it

    def rediscover(self) -> None:
        """A new training may begin here with new objects (a notebook cell run again, another
        fit of a trainer): the next optimizer that steps becomes the primary, unless watch()
        named one, and the next step looks for models again."""
        if not self._named:
            self._primary = None
        self._set_global_hooks(True)

    def request_trace(self) -> None:
        """Trace the next step (a diagnosis wants per-module detail now)."""
        self._trace_requested = True

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.steps_done,
            "last_step": self.last.get("step"),
            "loss": self.last.get("loss"),
            "step_time": self.last.get("duration"),
            "rank": self.rank,
            "hooks_on": self.switch.on,
        }
        return out


def _autocast_now(torch: Any) -> list[tuple[str, Any]]:
    out = []
    for device in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device):
                out.append((device, torch.get_autocast_dtype(device)))
        except (TypeError, RuntimeError, AttributeError):  # torch without per-device autocast
            continue
    return out


_RANDOM_MODULES = ("Dropout", "RReLU", "Transformer", "MultiheadAttention")


def _has_randomness(module: Any) -> bool:
    """Whether a model contains modules that draw random numbers in training mode."""
    for sub in module.modules():
        name = type(sub).__name__
        if any(key in name for key in _RANDOM_MODULES):
            p = getattr(sub, "p", getattr(sub, "dropout", None))
            if not isinstance(p, (int, float)) or p > 0 or "Transformer" in name:
                return True
    return False


_TORCH_DIR = ""


def _caller_site() -> tuple[str, int] | None:
    """(file, line) of the code that called backward(): the first frame outside torch."""
    global _TORCH_DIR
    if not _TORCH_DIR:
        import torch

        _TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
    frame: Any = sys._getframe(3)
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        frame = frame.f_back
    return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else None


def _rank_from_env() -> int:
    for var in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def _jsonable(value: float) -> Any:
    return value if math.isfinite(value) else str(value)
