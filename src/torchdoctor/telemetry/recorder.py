"""Training telemetry with no code changes: one python.steps row per training step.

The Recorder holds the run's training state and turns events into rows; the patches and hooks
that deliver the events are thin adapters in `torch_hooks`. Where each phase is measured:
  data_wait  DataLoader iterators' __next__
  forward    from a model call to backward() (model pre-hooks; see `phases`)
  backward   torch.autograd.backward (which Tensor.backward calls)
  optimizer  optimizer.step() (global optimizer step pre/post hooks)
  other      the rest of the step (zero_grad, logging, your own code)

Where steps end (`mode`):
  optimizer  a step of the primary optimizer (the first that steps, or the one given to
             watch()); other optimizers' steps go to python.optimizer_steps
  cycle      no optimizer step is seen (parameters updated by hand, or an optimizer inside a
             compiled function): a step ends where the gradients are reset between two
             backward() calls; backward() calls with no reset between them are micro-batches
  manual     the script calls torchdoctor.step()
"""

from __future__ import annotations

import math
import sys
import threading
import time
import weakref
from typing import Any, Protocol

from torchdoctor._failsafe import Switch, warn_once
from torchdoctor._json import dumps
from torchdoctor.frames import user_frame
from torchdoctor.telemetry import (
    collectives,
    compile_events,
    discovery,
    gradients,
    process_group,
    torch_hooks,
)
from torchdoctor.telemetry.clock import CpuClock, CudaClock
from torchdoctor.telemetry.gradient_check import Check, GradientCheck, guard_update
from torchdoctor.telemetry.invisible import compile_in_use
from torchdoctor.telemetry.local_shards import local
from torchdoctor.telemetry.memory import MemoryReader
from torchdoctor.telemetry.models import Models
from torchdoctor.telemetry.patches import Hooks
from torchdoctor.telemetry.phases import PhaseTimer
from torchdoctor.telemetry.readback import Readback
from torchdoctor.telemetry.safe_point import SafePoint
from torchdoctor.telemetry.shapes import ShapeRecorder
from torchdoctor.telemetry.step import TAPE_LIMIT, OptimizerStepRow, StepRow, StepState
from torchdoctor.telemetry.tracer import Tracer

OPTIMIZER, CYCLE, MANUAL = "optimizer", "cycle", "manual"


class Host(Protocol):
    """What the Recorder needs from the process it records."""

    tables: Any  # store.tables.Tables
    config: Any  # config.Config, read live (trace_every and guard change on a running probe)

    def on_cuda_detected(self) -> None: ...


class Recorder:
    def __init__(self, host: Host, rank: int = 0) -> None:
        import torch

        self.torch = torch
        self.host = host
        self.tables = host.tables
        self.switch = Switch("telemetry")
        self.hooks = Hooks()
        self._root_hooks = Hooks()
        self._global_hooks = Hooks()
        self.memory = MemoryReader(torch)
        self.models = Models()
        self.tracer = Tracer(self)
        self.shapes = ShapeRecorder(self)
        self.clock: Any = CpuClock()
        self.readback = Readback(torch)
        self.gradients = GradientCheck(torch)
        self.timer = PhaseTimer()
        self.rank = rank
        self.train_thread = threading.main_thread().ident
        self.mode = CYCLE
        self.step = 0  # the step in progress
        self._next_rank_poll = 0.0  # perf_counter time of the next process_group.poll()
        self.steps_done = 0
        self.state = StepState(None)
        self._closing: StepState | None = None  # split off at a data fetch or model call
        self._grad_probe: Any = None  # (weakref to a parameter, id of its grad, grad version)
        self._last_row: Any = None
        self.tracing = False
        self.discovering = True
        self.shaping = True  # python.shapes rows: the discovery step and traced steps
        # Called with (finished StepState, its step) at the end of every step: the overfit and
        # repro recipes count and judge steps here; empty in a normal run.
        self.step_listeners: list[Any] = []
        self.compiled = False  # torch.compile is in use: no global module hooks from now on
        self.sync_check = False  # CUDA: read the gradient norm before the update (after a NaN)
        # Keep the random state per step only for models that draw random numbers (dropout):
        # a NaN replay must see the same masks. Until the models are known, keep it.
        self._random = True
        self._random_known = False
        self._trace_requested = False
        self.nonfinite_steps = 0
        self.skipped_steps = 0
        self.on_nonfinite: list[Any] = []  # callbacks(recorder, info) before the update
        self._primary: Any = None
        self._optimizers: weakref.WeakKeyDictionary[Any, tuple[str, int]] = (
            weakref.WeakKeyDictionary()
        )
        self._open_steps: dict[int, tuple[float, Check | None]] = {}  # optimizer -> (t0, check)
        self._pending_updates: dict[int, Any] = {}  # step -> its primary row, until read back
        self._optimizer_calls = 0
        self._gdepth = 0  # nesting of module calls, while global hooks are on
        self._pending_roots: list[Any] = []
        self._setup_memory_done = False
        self._closure_checked = False
        self._named = False  # watch() named the primary optimizer: rediscover() keeps it
        self._backward_end = 0.0
        self._scanned = False  # looked for models in the training code's frames
        self._cycle_params: tuple[int, list[Any]] = (-1, [])
        self._compile_watch: Any = None
        self.collective_calls: Any = None  # telemetry.collectives.Collectives, once installed
        self.safe_point = SafePoint()  # the probe's evals, run between two steps

    # -- install / remove ------------------------------------------------------------------
    def install(self) -> None:
        self.compiled = compile_in_use(self.torch)
        torch_hooks.install(self, self.torch, self.hooks)
        if not self.compiled:
            self.set_global_hooks(True)
        from torchdoctor.telemetry.nan_replay import NanLocalizer

        NanLocalizer(self)
        # torch.compile's own events (graph breaks, recompilations), once Dynamo is imported
        watch = compile_events.install(self.tables, lambda: self.step, self.rank)
        self._compile_watch = watch
        self.hooks.on_remove(watch.remove)
        self.collective_calls = collectives.install(self, self.hooks)  # python.collectives
        self.hooks.on_remove(self._root_hooks.remove)
        self.hooks.on_remove(lambda: self.set_global_hooks(False))
        self.memory.start()
        self.hooks.on_remove(self.memory.close)

    def remove(self) -> None:
        try:
            self._flush_closing()
            if self.mode == CYCLE and self.state.micro:  # the last step has no next one
                self._end_step(self._backward_end, skipped=False)
            self.readback.poll(force=True)
            self.settle_collectives()  # the last works, their errors read (the hot path does not)
            self.tracer.flush(force=True)
            self.shapes.end()  # a step cut short (a crash): its calls so far
            for module, label in self.models.models():  # found in a first step that never ended
                if any(module is m for m in self._pending_roots):
                    self.tables["modules"].extend(self.models.module_rows(module, label))
        except Exception as exc:
            warn_once("final-flush", f"could not read back the last steps: {exc}")
        self.switch.on = False
        self.hooks.remove()

    def disable_in_child(self) -> None:
        self.switch.on = False

    def set_rank(self, rank: int) -> None:
        """torch.distributed told the process its rank: rows from now on carry it."""
        self.rank = rank
        if self._compile_watch is not None:
            self._compile_watch.rank = rank

    def set_global_hooks(self, on: bool) -> None:
        self._gdepth = 0
        if on and not len(self._global_hooks):
            torch_hooks.add_global_module_hooks(self, self._global_hooks)
        elif not on:
            self._global_hooks.remove()

    # -- the public view of the run (what memory/, the doctor and the NaN replay read) ---------
    @property
    def phase(self) -> str:
        """What the training thread runs now: data, forward, backward, optimizer or other."""
        return self.timer.phase

    @property
    def primary(self) -> Any:
        return self._primary() if self._primary is not None else None

    def lr(self, optimizer: Any = None) -> float | None:
        opt = optimizer if optimizer is not None else self.primary
        try:
            lr = opt.param_groups[0]["lr"] if opt is not None else None
        except (AttributeError, IndexError, KeyError, TypeError):
            return None
        if isinstance(lr, (int, float)):
            return float(lr)
        if isinstance(lr, self.torch.Tensor) and lr.device.type == "cpu":
            return float(lr)
        return None

    @property
    def last(self) -> dict[str, Any]:
        """The latest step row's headline numbers (for the status line and `list`)."""
        row = self._last_row
        if row is None:
            return {}
        return {
            "step": row.step,
            "time": row.time,
            "duration": row.duration,
            "data_wait": row.data_wait,
            "loss": row.loss,
            "allocated": row.allocated,
        }

    def status(self) -> dict[str, Any]:
        return {
            "step": self.steps_done,
            "last_step": self.last.get("step"),
            "loss": self.last.get("loss"),
            "step_time": self.last.get("duration"),
            "rank": self.rank,
            "hooks_on": self.switch.on,
            "step_mode": self.mode,
        }

    def request_trace(self) -> None:
        """Trace the next step (a diagnosis wants per-module detail now)."""
        self._trace_requested = True

    def settle_collectives(self) -> None:
        if self.collective_calls is not None:
            self.collective_calls.poll()  # thread-safe

    def model_inputs(self) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
        return list(self.state.tape)

    def last_traced_backward(self) -> str | None:
        return self.tracer.last_backward()

    def module_calls(self) -> tuple[int | None, list[dict[str, Any]], bool]:
        return self.shapes.flow()

    def event(self, kind: str, data: dict[str, Any]) -> None:
        self.tables["events"].append((time.time(), self.step, kind, dumps(data)))

    def watch(self, model: Any, optimizer: Any = None, name: str | None = None) -> None:
        if self.models.add(model, name):
            self._hook_roots([model])
        if optimizer is not None:
            self._adopt(optimizer)
            self._named = True

    def rediscover(self) -> None:
        """A new training may begin here with new objects (a notebook cell run again, another
        fit of a trainer): the next optimizer that steps becomes the primary, unless watch()
        named one, and the next step looks for models again."""
        if not self._named:
            self._primary = None
            self.mode = CYCLE
        self._scanned = False
        self.discovering = True
        if not self.compiled:
            self.set_global_hooks(True)
            self.shaping = True
            self.shapes.begin(self.step)

    def manual_step(self, loss: Any = None) -> None:
        """torchdoctor.step(): the end of a step in a loop the script marks itself."""
        if not self.switch.on:
            return
        self.mode = MANUAL
        self._flush_closing()
        if loss is not None and not self.state.losses:
            self._note_loss(local(loss))
        self._end_step(time.perf_counter(), skipped=False)

    # -- events from the hooks (the training thread; torch_hooks checks that) ----------------
    def on_compile(self) -> None:
        """torch.compile was called: Dynamo must never see a global module hook of ours."""
        if not self.compiled:
            self.compiled = True
            self.set_global_hooks(False)
            self.tracing = False
            self.shaping = False
            self._scanned = False  # the compiled models may be new: look again
            self.event("compile_seen", {"module_tracing": "off"})

    def on_data(self, now: float) -> None:
        if self.mode == CYCLE:
            self._activity(now)
        state = self.state
        if state.start is None:
            state.start = now
        self.timer.enter("data", now, state.phases)

    def on_data_done(self, now: float) -> None:
        self.timer.exit("data", now, self.state.phases)

    def on_model_call(self, module: Any, args: Any, kwargs: Any) -> None:
        if self._gdepth > 1:
            return  # a model called inside another model (global hooks tell us so)
        self._forward_begins(module, args, kwargs)

    def on_global_pre(self, module: Any, args: Any) -> None:
        top = self._gdepth == 0
        self._gdepth += 1
        if top and not self.models.is_root(module):
            self._forward_begins(module, args, {})
            if self.models.add(module):
                self._pending_roots.append(module)
        if self.shaping:
            self.shapes.enter(module, self.models.name_of(module), args)
        if self.tracing:
            self.tracer.enter(module, self.models.name_of(module), time.time())

    def on_global_post(self, module: Any, output: Any) -> None:
        self._gdepth = max(0, self._gdepth - 1)
        if self.shaping:
            self.shapes.exit(module, output)
        if self.tracing:
            self.tracer.exit(module, output)

    def on_backward(self, tensors: Any, now: float) -> None:
        if self.mode == CYCLE:
            self._cycle_boundary(now)
        if not self._scanned:
            self._scanned = True  # looked at once per compile: roots are found by hooks else
            if not self.models.roots():
                self._discover_from_frames()
        state = self.state
        if state.start is None:
            state.start = now
        self.timer.enter("backward", now, state.phases)
        loss = tensors  # the one scalar tensor backward() ran on, if that is what it got
        if isinstance(loss, (tuple, list)):
            loss = loss[0] if len(loss) == 1 else None
        if isinstance(loss, self.torch.Tensor) and loss.numel() == 1:
            self._note_loss(local(loss))
        else:
            loss = None
        if self.mode == CYCLE and self._grad_probe is None:
            self._grad_probe = _leaf_of(loss)

    def on_backward_done(self, now: float) -> None:
        state = self.state
        self.timer.exit("backward", now, state.phases)
        state.micro += 1
        self._backward_end = now
        if self.tracing:
            self._memory_row("backward")
        in_step = self.timer.inside("optimizer")  # a closure that optimizer.step() runs
        losses = state.closure_losses if in_step else state.losses
        last = losses[-1] if losses else None
        if isinstance(last, float) and not math.isfinite(last):
            # Caught here too, for loops that skip optimizer.step() on a bad loss.
            self._nonfinite({"step": self.step, "grad_norm": None, "losses": [last]})
        if self.mode == CYCLE:
            self._after_cycle_backward()
        elif in_step and not self._closure_checked:
            self._closure_checked = True  # LBFGS: the gradients of the first closure call
            primary = self.primary
            if primary is not None and id(primary) in self._open_steps:
                t0, _old = self._open_steps[id(primary)]
                self._open_steps[id(primary)] = (t0, self._check_primary(primary))

    def on_optimizer(self, optimizer: Any, now: float) -> None:
        self._optimizer_calls += 1
        primary = self.primary
        if primary is None:
            self._adopt(optimizer)
            self.train_thread = threading.get_ident()
            primary = optimizer
        if self.mode != OPTIMIZER and optimizer is primary:
            self._flush_closing(merge=True)
            self.mode = OPTIMIZER
        state = self.state
        if state.start is None:
            state.start = now
        self.timer.enter("optimizer", now, state.phases)
        if optimizer is primary:
            self._closure_checked = False
            check = self._check_primary(optimizer)
        else:
            check = self._check_other(optimizer)
        self._open_steps[id(optimizer)] = (now, check)

    def on_optimizer_done(self, optimizer: Any, now: float) -> None:
        state = self.state
        self.timer.exit("optimizer", now, state.phases)
        t0, check = self._open_steps.pop(id(optimizer), (now, None))
        if optimizer is not self.primary:
            self._other_step_row(optimizer, now - t0, check)
            return
        state.update = (optimizer, now - t0)
        if self.tracing:
            self._memory_row("optimizer")
        self._end_step(now, skipped=state.skip)

    def on_scale(self, scaled: Any, loss: Any) -> None:
        self.state.scaled = (scaled, loss)  # backward(scaled) reports `loss`

    def on_scaler_skipped(self, optimizer: Any, now: float) -> None:
        """GradScaler skipped optimizer.step() (inf/NaN gradients): still a step, skipped."""
        if self.primary is None:
            self._adopt(optimizer)
        if optimizer is self.primary:
            self.mode = OPTIMIZER
            self._end_step(now, skipped=True)

    def on_clip(self, norm: Any) -> None:
        self.state.clip_norm = norm  # the total norm before clipping: no need to recompute

    # -- model calls -------------------------------------------------------------------------
    def _forward_begins(self, module: Any, args: Any, kwargs: Any) -> None:
        now = time.perf_counter()
        if not self._setup_memory_done:
            self._setup_memory_done = True
            self._memory_row("setup")
            if self.memory.on_cuda():  # allocator history from the first step, not the second
                self.host.on_cuda_detected()
        if self.mode == CYCLE:
            self._activity(now)
        state = self.state
        if not state.tape:
            if self._random:
                state.rng = self.torch.get_rng_state()  # a NaN replay draws the same numbers
            state.autocast = _autocast_now(self.torch)  # and runs in the same precision
        if len(state.tape) < TAPE_LIMIT:
            state.tape.append((module, args, kwargs))
        if self.timer.begin_forward(now, state.phases) and state.start is None:
            state.start = now

    def _hook_roots(self, modules: list[Any]) -> None:
        for module in modules:
            self._root_hooks.handle(
                module.register_forward_pre_hook(torch_hooks.model_hook(self), with_kwargs=True)
            )
            self._random = self._random or _has_randomness(module)
            for root, label in self.models.models():
                if root is module:
                    self.tables["modules"].extend(self.models.module_rows(module, label))
                    self.event("model", {"name": label, "type": type(module).__name__})

    def _discover_from_frames(self) -> None:
        """No model call was seen (compiled code, or global hooks off): look at what the
        training code holds."""
        found = discovery.modules_in_reach(self.torch.nn.Module, sys._getframe(2))
        new = [m for m in found if self.models.add(m)]
        if new:
            self._hook_roots(new)

    # -- steps found from the backward/update cycle ------------------------------------------
    def _activity(self, now: float) -> None:
        """A data fetch or model call: in cycle mode, the first one after a backward() may
        start the next step (the gradients tell, now or at the next backward())."""
        state = self.state
        if self.mode != CYCLE or not state.micro or self._closing is not None:
            return
        if self.timer.inside("optimizer"):
            return
        if self._grads_reset():
            self._end_step(now, skipped=False)
        else:
            self._closing, self.state = state, StepState(now)

    def _cycle_boundary(self, now: float) -> None:
        closing = self._closing
        if closing is not None:
            self._closing = None
            if self._grads_reset():
                self._finish(closing, self.state.start or now, skipped=False)
            else:
                self.state = closing.absorb(self.state)
        elif self.state.micro and self._grads_reset():
            self._end_step(now, skipped=False)

    def _flush_closing(self, merge: bool = False) -> None:
        closing = self._closing
        if closing is None:
            return
        self._closing = None
        if merge:
            self.state = closing.absorb(self.state)
        else:
            self._finish(closing, self.state.start or time.perf_counter(), skipped=False)

    def _grads_reset(self) -> bool:
        """Whether the gradients seen after the last backward() were cleared or replaced."""
        probe = self._grad_probe
        if probe is None or len(probe) != 3:
            return True  # nothing to compare with: each backward() is a step
        param = probe[0]()
        grad = getattr(param, "grad", None)
        return grad is None or id(grad) != probe[1] or grad._version != probe[2]

    def _after_cycle_backward(self) -> None:
        probe = self._grad_probe
        param = probe[0]() if probe else None
        grad = getattr(param, "grad", None)
        self._grad_probe = (probe[0], id(grad), grad._version) if grad is not None else None
        version, params = self._cycle_params
        if version != self.models.version:
            params = [p for model, _label in self.models.models() for p in model.parameters()]
            self._cycle_params = (self.models.version, params)
        if not params:
            return
        check = self.gradients.of_params(0, params, read_now=self._read_now())
        self._judge(check, self.state, guard=False)

    # -- optimizers --------------------------------------------------------------------------
    def _adopt(self, optimizer: Any) -> None:
        """The optimizer whose steps are the rows of python.steps (held weakly)."""
        self._primary = weakref.ref(optimizer)

    def _read_now(self) -> bool:
        return not self.clock.cuda or bool(self.host.config.guard) or self.sync_check

    def _check_primary(self, optimizer: Any) -> Check:
        state = self.state
        read_now = not self.clock.cuda or bool(self.host.config.guard) or self.sync_check
        check = self.gradients.of_optimizer(optimizer, state.clip_norm, read_now)
        if self.tracing:
            self._module_grads(optimizer)
        self._judge(check, state, guard=bool(self.host.config.guard))
        return check

    def _judge(self, check: Check, state: StepState, guard: bool) -> None:
        state.grad_norm, state.grad_norm_value = check.norm, check.value
        if check.value is None:
            return
        losses = state.step_losses()
        if math.isfinite(check.value) and _all_finite(losses):
            return
        self._nonfinite(
            {
                "step": self.step,
                "grad_norm": check.value,
                "losses": list(losses),
                "params": check.params,
            }
        )
        if guard and guard_update(check):
            state.skip = True
            self.event("guard_skip", {"grad_norm": check.value})  # event() cleans it

    def _check_other(self, optimizer: Any) -> Check:
        check = self.gradients.of_optimizer(optimizer, None, self._read_now())
        if self.host.config.guard and guard_update(check):
            self.event("guard_skip", {"optimizer": self._label(optimizer)})
        return check

    def _label(self, optimizer: Any) -> str:
        return self._optimizer_info(optimizer)[0]

    def _optimizer_info(self, optimizer: Any) -> tuple[str, int]:
        """(the script's name for it, lag): lag 1 for an optimizer that first stepped after the
        primary had ended a step, as a GAN's generator does after its discriminator: its
        updates belong to the step that just ended (the same iteration), not the next one."""
        info = self._optimizers.get(optimizer)
        if info is None:
            taken = {label for label, _lag in self._optimizers.values()}
            label = _optimizer_label(optimizer, taken, sys._getframe(1))
            lag = 1 if optimizer is not self.primary and self.steps_done > 0 else 0
            info = self._optimizers[optimizer] = (label, lag)
        return info

    def _other_step_row(self, optimizer: Any, duration: float, check: Check | None) -> None:
        losses = self.state.claim()
        label, lag = self._optimizer_info(optimizer)
        row = OptimizerStepRow(
            step=max(0, self.step - lag),
            optimizer=label,
            is_primary=False,
            loss=None if self.clock.cuda else _mean(losses),
            grad_norm=check.value if check is not None else None,
            lr=self.lr(optimizer),
            duration=duration,
            skipped=check is not None and not check.finite and bool(self.host.config.guard),
            time=time.time(),
            rank=self.rank,
        )
        norm = check.norm if check is not None and check.value is None else None
        self._emit(self.tables["optimizer_steps"], row, losses, norm, steps=False)

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

    # -- losses ------------------------------------------------------------------------------
    def _note_loss(self, loss: Any) -> None:
        state = self.state
        scaled = state.scaled
        if scaled is not None and scaled[0] is loss:
            loss = scaled[1]
        if self.tracing:
            self._memory_row("forward")
        state.loss_ref = loss
        caller = user_frame(sys._getframe(1))
        state.backward_site = (caller.f_code.co_filename, caller.f_lineno) if caller else None
        value = loss.detach() if self.clock.cuda else loss.item()
        if self.timer.inside("optimizer"):
            state.closure_losses.append(value)
        else:
            state.losses.append(value)

    # -- step boundary -----------------------------------------------------------------------
    def _end_step(self, now: float, skipped: bool) -> None:
        state = self.state
        self.timer.end_forward(now, state.phases)
        self.state = StepState(time.perf_counter())
        self._finish(state, now, skipped)

    def _finish(self, state: StepState, end: float, skipped: bool) -> None:
        """The row of a finished step; then get ready for the next one."""
        if end >= self._next_rank_poll:  # a rank whose init_process_group we did not see
            self._next_rank_poll = end + 1.0  # return: two torch calls, not worth every step
            process_group.poll()
        if self.tracing:
            self.tracer.end(self.clock.mark())
        if self.shaping:
            self.shapes.end()
        allocated, peak, reserved, rss = self.memory.read()
        duration = max(0.0, end - (state.start if state.start is not None else end))
        phases = state.phases
        losses = state.step_losses()
        row = StepRow(
            step=self.step,
            time=time.time(),
            duration=duration,
            data_wait=phases["data_wait"],
            forward=phases["forward"],
            backward=phases["backward"],
            optimizer=phases["optimizer"],
            other=max(0.0, duration - sum(phases.values())),
            loss=sum(losses) / len(losses) if losses and not self.clock.cuda else None,
            grad_norm=state.grad_norm_value,
            lr=self.lr(),
            allocated=allocated,
            max_allocated=peak,
            reserved=reserved,
            rss=rss,
            rank=self.rank,
            micro_batches=state.micro,
            skipped=skipped,
            traced=self.tracing,
        )
        norm = state.grad_norm if state.grad_norm_value is None else None
        self._emit(self.tables["steps"], row, losses, norm, steps=True)
        if state.update is not None:  # the primary's own python.optimizer_steps row
            self._primary_update_row(state.update, row)
        if skipped:
            self.skipped_steps += 1
        self.step += 1
        self.steps_done += 1
        self._after_step()
        if self.step_listeners:
            for listener in self.step_listeners:
                listener(state, self.step - 1)
        if self.safe_point.pending:
            self._run_safe_point(row.step)

    def _primary_update_row(self, update: tuple[Any, float], step_row: Any) -> None:
        """The primary optimizer's row of python.optimizer_steps, from its python.steps row (on
        CUDA it follows that row's read-back: see _append)."""
        optimizer, duration = update
        row = OptimizerStepRow(
            step=step_row.step,
            optimizer=self._label(optimizer),
            is_primary=True,
            loss=step_row.loss,
            grad_norm=step_row.grad_norm,
            lr=step_row.lr,
            duration=duration,
            skipped=step_row.skipped,
            time=step_row.time,
            rank=step_row.rank,
        )
        if self.clock.cuda:
            self._pending_updates[step_row.step] = row
        else:
            self.tables["optimizer_steps"].append(row)

    def _emit(self, table: Any, row: Any, losses: list[Any], norm: Any, steps: bool) -> None:
        """Append a row. On CUDA its loss and gradient norm are read back asynchronously and
        the row waits until they have landed: no sync per step."""
        if not self.clock.cuda:
            if steps:
                self._last_row = row
            table.append(row)
            return
        torch = self.torch
        device = torch.device("cuda", torch.cuda.current_device())
        nan = torch.full((), float("nan"), device=device)
        tensors = [torch.as_tensor(v, device=device).float().reshape(()) for v in losses]
        loss = torch.stack(tensors).mean() if tensors else nan
        value = torch.as_tensor(norm).float().reshape(()).to(device) if norm is not None else nan
        has_loss, has_norm = bool(losses), norm is not None

        def done(values: list[float]) -> None:
            loss_value, norm_value = values
            filled = row._replace(
                loss=loss_value if has_loss else None,
                grad_norm=norm_value if has_norm else row.grad_norm,
            )
            self._append(table, filled, steps)
            if not steps:
                return
            bad_loss = has_loss and not math.isfinite(loss_value)
            if bad_loss or (has_norm and not math.isfinite(norm_value)):
                late = {"step": row.step, "grad_norm": norm_value, "losses": [loss_value]}
                self._nonfinite(dict(late, late=True), once_per_step=False)

        self.readback.submit(torch.stack([loss, value]), done)
        self.readback.poll()

    def _append(self, table: Any, row: Any, steps: bool) -> None:
        table.append(row)
        if steps:
            self._last_row = row
            update = self._pending_updates.pop(row.step, None)
            if update is not None:
                self.tables["optimizer_steps"].append(
                    update._replace(loss=row.loss, grad_norm=row.grad_norm)
                )

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
                self.host.on_cuda_detected()
        if self.tracer.pending:
            self.tracer.flush()
        every = self.host.config.trace_every
        tracing = self._trace_requested or (bool(every) and (every == 1 or self.step % every == 1))
        tracing = tracing and not self.compiled
        self._trace_requested = False
        if tracing:
            self.tracer.begin(self.step, self.clock)
            self.shapes.begin(self.step)
        if tracing != bool(len(self._global_hooks)):  # on for discovery and traced steps only
            self.set_global_hooks(tracing)
        self.tracing = tracing
        self.shaping = tracing

    def _run_safe_point(self, after_step: int) -> None:
        """Queued evals, with the telemetry off: what they call (a forward, a backward) is
        theirs, not a step of the training."""
        was_on, self.switch.on = self.switch.on, False
        try:
            self.safe_point.drain(after_step)
        finally:
            self.switch.on = was_on

    # -- helpers -----------------------------------------------------------------------------
    def _memory_row(self, phase: str) -> None:
        allocated, peak, reserved, _rss = self.memory.read_now()
        self.tables["memory"].append(
            (self.step, phase, allocated, peak, reserved, time.time(), self.rank)
        )

    def loader_seen(self, loader: Any) -> None:
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


def _all_finite(values: list[Any]) -> bool:
    """No float among `values` is NaN or Inf (tensors, read back later, are judged then)."""
    isfinite = math.isfinite
    for v in values:  # noqa: SIM110 (a generator costs a frame per call)
        if isinstance(v, float) and not isfinite(v):
            return False
    return True


def _mean(values: list[Any]) -> float | None:
    return sum(values) / len(values) if values else None


def _leaf_of(loss: Any, limit: int = 256) -> Any:
    """(weakref to) a parameter the loss's graph reaches: its gradient tells a reset (a new
    step) from accumulation (a micro-batch)."""
    todo = [getattr(loss, "grad_fn", None)]
    seen = 0
    while todo and seen < limit:
        node = todo.pop()
        if node is None:
            continue
        seen += 1
        variable = getattr(node, "variable", None)
        if variable is not None:
            try:
                return (weakref.ref(variable),)
            except TypeError:
                return None
        todo.extend(n for n, _ in node.next_functions)
    return None


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


def _optimizer_label(optimizer: Any, taken: set[str], frame: Any) -> str:
    """The name the training code gives `optimizer` (a local of the loop that steps it, as in
    a `main()`, or a global of `__main__`), else its class and a number."""
    caller = user_frame(frame)
    spaces = [caller.f_locals, caller.f_globals] if caller is not None else []
    main = sys.modules.get("__main__")
    if main is not None:
        spaces.append(vars(main))
    for space in spaces:
        for key, value in list(space.items()):
            if value is optimizer and not key.startswith("_"):
                return key
    base, n = type(optimizer).__name__, 1
    while f"{base}{n}" in taken:
        n += 1
    return f"{base}{n}"
