"""Training telemetry with no code changes: one python.steps row per training step.

The Recorder turns the events the hooks deliver (torch_hooks.py: thin adapters, one per place
torch is entered) into rows. Each phase of a step is measured where torch is entered (see
phases.py): data_wait at DataLoader iterators' __next__ (and the loop's own input function,
gap_sampler.py), forward and evaluation inside the models' top-level calls, backward in
torch.autograd.backward, optimizer in optimizer.step(); other is the rest.

Where a step ends, decided by one of three modes, chosen as the run shows itself:
  optimizer  an update of the primary optimizer (optimizers.py: the first that steps, or
             the one given to watch()); other optimizers' updates are python.optimizer_steps
  cycle      until an optimizer is seen to step: where the gradients are reset between two
             backward() calls (cycle_steps.py); loops that update by hand stay in it
  manual     once the script calls torchdoctor.step()

Parts, each the only writer of its state: the step in progress (step.py: a StepState replaced
whole when the step ends), its phases (phases.py), the gradient check and --guard
(gradient_check.py), the optimizers (optimizers.py), the models and their hooks
(model_roots.py), the rows (step_rows.py), module tracing (tracer.py, shapes.py), the
silent-error checks on sampled steps (silent/: called behind `if self.silent.active`).

Most steps are steady (steady.py): the hooks call compiled handlers for them then
(native/steady.cpp), and the handlers here for everything else.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import time
from typing import Any

from torchdoctor._failsafe import Switch, first_line, keep_to_exit, warn_once
from torchdoctor._json import dumps
from torchdoctor.telemetry import collectives, compile_events, process_group, steady, torch_hooks
from torchdoctor.telemetry.clock import CpuClock, CudaClock
from torchdoctor.telemetry.cycle_steps import CycleSteps
from torchdoctor.telemetry.gap_sampler import GapSampler
from torchdoctor.telemetry.gradient_check import Check, GradientCheck
from torchdoctor.telemetry.invisible import compile_in_use
from torchdoctor.telemetry.local_shards import local
from torchdoctor.telemetry.memory import MemoryReader
from torchdoctor.telemetry.model_roots import ModelRoots
from torchdoctor.telemetry.models import Models
from torchdoctor.telemetry.nonfinite import NonFinite, late
from torchdoctor.telemetry.optimizers import Optimizers, learning_rate
from torchdoctor.telemetry.patches import Hooks
from torchdoctor.telemetry.phases import new_timer
from torchdoctor.telemetry.readback import Readback
from torchdoctor.telemetry.run_view import Host, RunView
from torchdoctor.telemetry.safe_point import SafePoint
from torchdoctor.telemetry.shapes import ShapeRecorder
from torchdoctor.telemetry.silent import SilentChecks
from torchdoctor.telemetry.step import StepState
from torchdoctor.telemetry.step_rows import StepRows
from torchdoctor.telemetry.trace_plan import TracePlan
from torchdoctor.telemetry.tracer import Tracer
from torchdoctor.telemetry.updates import Updates

OPTIMIZER, CYCLE, MANUAL = "optimizer", "cycle", "manual"


class Recorder(RunView):
    def __init__(self, host: Host, rank: int = 0) -> None:
        import torch

        self.torch = torch
        self.host = host
        self.tables = host.tables
        self.switch = Switch("telemetry")
        self.hooks = Hooks()
        self.memory = MemoryReader(torch)
        self.models = Models()
        self.roots = ModelRoots(self.models, self.tables, self.event, torch.default_generator)
        self.optimizers = Optimizers()
        self.updates = Updates(self)  # what happens at optimizer.step()
        self.tracer = Tracer(self)
        self.shapes = ShapeRecorder(self)
        self.clock: Any = CpuClock()
        self.readback = Readback(torch)
        self.rows = StepRows(torch, self.tables, self.readback, functools.partial(late, self))
        self.gradients = GradientCheck(torch)
        self.timer = new_timer()
        self.rank = rank
        self.train_thread = threading.main_thread().ident
        self.mode = CYCLE
        self.cycle: CycleSteps | None = CycleSteps(self)  # None once another mode took over
        self.step = 0  # the step in progress
        self.steps_done = 0
        self.state = StepState(None)
        self.plan = TracePlan(self)  # which steps see every module call
        self.step_listeners: list[Any] = []  # (StepState, step) at each end: the recipes' counts
        self.compiled = False  # torch.compile is in use: no global module hooks from now on
        self.nonfinite = NonFinite()  # non-finite steps and what runs when one is seen
        self.skipped_steps = 0
        self.collective_calls: Any = None  # telemetry.collectives.Collectives, once installed
        self.safe_point = SafePoint()  # the probe's evals, run between two steps
        self.memory_at_setup = False  # python.memory's "setup" row was written
        self.next_rank_poll = 0.0  # perf_counter time of the next process_group.poll()
        self._compile_watch: Any = None
        self.gaps = GapSampler(self)  # stack samples of the gaps, when the doctor asks
        self.silent = SilentChecks(self)  # silent-error checks on sampled steps (silent/)
        self.steady: Any = None  # the primary's weakref.ref while the step is steady (steady.py)
        self.allow_steady = True  # False: every step takes the general path (the tests' twin)
        self.steady_handlers = steady.handlers(self)  # compiled (steady.py); None: not built
        self.python_model_hook = torch_hooks.model_hooks(self)  # while torch.compile is in use
        self.model_hook = torch_hooks.compiled_model_hooks(self, self.python_model_hook)
        self._python_twins: Any = None  # swaps the optimizer hooks (torch_hooks.install)

    # -- install / remove ------------------------------------------------------------------
    def install(self) -> None:
        self.compiled = compile_in_use(self.torch)
        if self.compiled:
            self.model_hook = self.python_model_hook
        self._python_twins = torch_hooks.install(self, self.torch, self.hooks)
        if not self.compiled:
            self.plan.global_hooks(True)
        from torchdoctor.telemetry.nan_replay import NanLocalizer

        NanLocalizer(self)
        # torch.compile's own events (graph breaks, recompilations), once Dynamo is imported
        self._compile_watch = compile_events.install(self.tables, lambda: self.step, self.rank)
        self.hooks.on_remove(self._compile_watch.remove)
        self.collective_calls = collectives.install(self, self.hooks)  # python.collectives
        self.hooks.nest(self.roots.hooks)
        self.hooks.nest(self.plan.hooks, undo=lambda: self.plan.global_hooks(False))
        self.memory.start()
        self.hooks.on_remove(self.memory.close)
        self.hooks.on_remove(self.gaps.stop)
        self.silent.install(self.hooks)

    def remove(self) -> None:
        try:
            if self.cycle is not None:
                self.cycle.flush(merge=False)
                if self.state.micro:  # the last step has no next one
                    self.end_step(self.cycle.backward_end, skipped=False)
            self.updates.handover.flush()  # other optimizers' last updates: their rows
            self.readback.poll_at_end()
            self.settle_collectives()  # the last works, their errors read (the hot path does not)
            self.shapes.end()  # a step cut short (a crash): its calls so far
            self.roots.unfinished_rows()
        except Exception as exc:  # a context an error broke: the tracer's events stay
            keep_to_exit(self.tracer)
            warn_once("final-flush", f"could not write the last steps: {first_line(exc)}")
        self.switch.on = False
        self.hooks.remove()

    def disable_in_child(self) -> None:  # a forked child's: off, patches and hooks gone
        self.switch.on = False
        self.hooks.remove_in_fork()

    def set_rank(self, rank: int) -> None:
        """torch.distributed told the process its rank: rows from now on carry it."""
        self.rank = rank
        if self._compile_watch is not None:
            self._compile_watch.rank = rank

    def event(self, kind: str, data: dict[str, Any]) -> None:
        self.tables["events"].append((time.time(), self.step, kind, dumps(data)))

    def watch(self, model: Any, optimizer: Any = None, name: str | None = None) -> None:
        if self.models.add(model, name):
            self.roots.hook([model], self.model_hook)
        if optimizer is not None:
            self.optimizers.adopt(optimizer, named=True)

    def rediscover(self, primary_too: bool = True) -> None:
        """A new training may begin here with new objects (a notebook cell run again, another
        fit of a trainer; a handover, primary_too=False): the next optimizer that steps becomes
        the primary, unless watch() named one, and the next step looks for models again."""
        if primary_too and not self.optimizers.named:
            self.optimizers.forget_primary()
            self.enter_mode(CYCLE)
        self.roots.scanned = False
        self.plan.rediscover(self.step, self.compiled)
        self.steady = None

    def manual_step(self, loss: Any = None) -> None:
        """torchdoctor.step(): the end of a step in a loop the script marks itself."""
        if not self.switch.on:
            return
        self.enter_mode(MANUAL)
        if loss is not None and not self.state.losses:
            self._note_loss(local(loss), sys._getframe(2))  # torchdoctor.step()'s caller
        self.end_step(time.perf_counter(), skipped=False)

    def training_thread_is_this_one(self) -> None:
        """The first optimizer step tells which thread trains (hooks elsewhere are ignored)."""
        self.train_thread = threading.get_ident()

    def enter_mode(self, mode: str) -> None:
        """Change how steps end (once: cycle -> optimizer or manual; rediscover() -> cycle). A
        step split off by cycle mode is merged into the step in progress."""
        if mode == self.mode:
            return
        if self.cycle is not None:
            self.cycle.flush(merge=mode == OPTIMIZER)
        self.mode = mode
        self.cycle = CycleSteps(self) if mode == CYCLE else None
        self.steady = None

    # -- what CycleSteps asks of the step in progress ------------------------------------------
    def split_state(self, now: float) -> StepState:
        closing, self.state = self.state, StepState(now)
        return closing

    def merge_state(self, closing: StepState) -> None:
        self.state = closing.absorb(self.state)

    def finish_state(self, state: StepState, end: float) -> None:  # a step cycle mode ended
        self._finish(state, end, skipped=False)

    def read_now(self) -> bool:
        """Read the gradient norm now (CPU; --guard or a NaN hunt on CUDA), not a step late."""
        return not self.rows.cuda or bool(self.host.config.guard) or self.nonfinite.sync_check

    # -- events from the hooks (the training thread; torch_hooks checks that) ----------------
    def on_compile(self) -> None:
        """torch.compile was called: Dynamo must never see a global module hook of ours."""
        if not self.compiled:
            self.compiled = True
            self.use_python_hooks()
            self.plan.compile_seen()
            self.roots.scanned = False  # the compiled models may be new: look again
            self.steady = None
            self.event("compile_seen", {"module_tracing": "off"})

    def use_python_hooks(self) -> None:
        """The compiled hooks (steady.py) swapped for their Python twins in place, once: Dynamo
        cannot trace a builtin, and traces the Python ones to nothing."""
        if self.model_hook is not self.python_model_hook:
            self.model_hook = self.python_model_hook
            self.roots.use(self.model_hook)
            if self._python_twins is not None:
                self._python_twins()

    def on_data(self, now: float) -> None:
        if self.cycle is not None:
            self.cycle.activity(now)
        state = self.state
        if state.start is None:
            state.start = now
        self.timer.enter("data", now, state.phases)
        if self.silent.active:
            self.silent.on_data()

    def on_data_done(self, now: float) -> None:
        self.timer.exit("data", now, self.state.phases)

    def on_model_call(self, module: Any, args: Any, kwargs: Any) -> None:
        """A model's forward begins (its pre-hook): the forward phase opens, and the step's
        first call is kept for a NaN replay (with the random state and precision it ran in)."""
        if self.plan.depth > 1:
            return  # a model called inside another model (global hooks tell us so)
        now = time.perf_counter()
        if not self.memory_at_setup:
            self.memory_at_setup = True
            self.memory_row("setup")
            if self.memory.on_cuda():  # allocator history from the first step, not the second
                self.host.on_cuda_detected()
        if self.cycle is not None:
            self.cycle.activity(now)
        state = self.state
        state.keep_call(module, args, kwargs, self.torch, self.roots.generator)
        segment = "forward" if self.torch.is_grad_enabled() else "evaluation"
        if self.timer.begin_forward(now, state.phases, segment) and state.start is None:
            state.start = now
        if self.silent.active or not module.training:
            self.silent.on_model_call(module, args, kwargs)

    def on_model_return(self, now: float) -> None:
        """A model's top-level call returned (its forward hook): the forward phase closes."""
        self.timer.end_forward(now, self.state.phases)

    def on_loss_call(self, module: Any, args: Any, kwargs: Any) -> None:
        """A root module without parameters (a loss module) is called: no phase of its own (a
        loss computed outside the model is `other`); kept for a NaN replay."""
        self.state.keep_call(module, args, kwargs, self.torch, self.roots.generator)

    def on_backward(self, tensors: Any, now: float, caller: Any) -> None:
        """backward() begins (`caller`: the frame that called torch.autograd.backward)."""
        loss = tensors  # the one scalar tensor backward() ran on, if that is what it got
        if isinstance(loss, (tuple, list)):
            loss = loss[0] if len(loss) == 1 else None
        if not isinstance(loss, self.torch.Tensor) or loss.numel() != 1:
            loss = None
        if self.cycle is not None:
            self.cycle.before_backward(now, loss)
        if not self.roots.scanned:
            self.roots.scan_frames(self.torch.nn.Module, caller, self.model_hook)
        state = self.state
        if state.start is None:
            state.start = now
        self.timer.enter("backward", now, state.phases)
        if loss is not None:
            self._note_loss(local(loss), caller)
        if self.silent.active:
            self.silent.on_backward(loss)

    def on_backward_done(self, now: float) -> None:
        state = self.state
        self.timer.exit("backward", now, state.phases)
        state.micro += 1
        if self.plan.tracing:
            self.memory_row("backward")
        in_step = self.timer.inside("optimizer")  # a closure that optimizer.step() runs
        losses = state.closure_losses if in_step else state.losses
        last = losses[-1] if losses else None
        if isinstance(last, float) and not math.isfinite(last):
            # Caught here too, for loops that skip optimizer.step() on a bad loss.
            info = {"step": self.step, "grad_norm": None, "losses": [last]}
            self.nonfinite.seen(self, state, info)
        if self.cycle is not None:
            self.cycle.after_backward(now)
        elif in_step and not self.optimizers.closure_checked:
            self.optimizers.closure_checked = True  # LBFGS: the first closure's gradients
            primary = self.optimizers.primary
            if primary is not None and self.optimizers.in_progress(primary):
                self.optimizers.recheck(primary, self.updates.check_primary(primary))

    def on_scale(self, scaled: Any, loss: Any) -> None:
        self.state.scaled = (scaled, loss)  # backward(scaled) reports `loss`

    def on_clip(self, norm: Any) -> None:
        self.state.clip_norm = norm  # the total norm before clipping: no need to recompute

    def judge(self, check: Check, guard: bool) -> None:  # the gradients' check of an update
        self.nonfinite.judge(self, self.state, check, guard)

    def _note_loss(self, loss: Any, caller: Any) -> None:
        if self.plan.tracing:
            self.memory_row("forward")
        site = self.roots.loss_site(caller)  # ours and torch's frames are not the place
        self.state.note_loss(loss, site, self.rows.cuda, self.timer.inside("optimizer"))

    # -- step boundary -----------------------------------------------------------------------
    def end_step(self, now: float, skipped: bool) -> None:
        state = self.state
        self.timer.step_ended(now, state.phases)
        self.state = StepState(time.perf_counter())
        self._finish(state, now, skipped)

    def _finish(self, state: StepState, end: float, skipped: bool) -> None:
        """The hot path's end: a finished step becomes its row; then the next step is set up.
        Everything here runs once per step; what need not is behind a cheap test."""
        if end >= self.next_rank_poll:  # a rank whose init_process_group we did not see:
            self.next_rank_poll = end + 1.0  # two torch calls, once a second
            process_group.poll()
        plan = self.plan
        if plan.tracing:
            self.tracer.end(self.clock.mark())
        if plan.shaping:
            self.shapes.end()
        update = state.update  # (primary, seconds): its own row too when there are several
        step = self.step
        self.rows.step(
            step,
            state,
            end,
            (skipped, plan.tracing, self.rank),
            self.memory.read(),  # as last sampled (a thread reads it every INTERVAL)
            learning_rate(update[0] if update else self.optimizers.primary),
            self.optimizers.label(update[0]) if update and self.optimizers.several else None,
        )
        self.skipped_steps += skipped  # the next step
        self.step = step + 1
        self.steps_done += 1
        if plan.discovering or self.roots.pending:
            self._after_discovery(state)
        plan.next_step(self.step, self.host.config.trace_every, self.compiled)
        self.silent.on_step_end(state, step)  # before the listeners: is the next one sampled
        for listener in self.step_listeners:
            listener(state, step)
        if self.safe_point.pending:
            self.safe_point.drain(step, self.switch)  # queued evals, the telemetry off
        # Asked again after a step that was not steady, or when a steady step's end changed
        # what it can (tracing, sampling, a second optimizer); the rest resets `steady` itself.
        if self.steady is None or plan.tracing or self.silent.active or self.optimizers.several:
            self.steady = steady.after(self)

    def _after_discovery(self, first: StepState) -> None:
        """The first step is over: hook its models, learn whether it ran on a GPU, tell the host."""
        self.roots.step_ended(self.model_hook)
        if self.plan.discovering:
            self.plan.discovering = False
            self.host.on_first_step()
            # a GPU run is one whose step ran there, not any process that touched CUDA once
            if self.memory.settle(first.ran_on_cuda(self.torch, self.models)):
                self.clock = CudaClock(self.torch)
                self.rows.cuda = True
                self.roots.draw_from(self.torch.cuda.default_generators[self.memory.device or 0])
                self.host.on_cuda_detected()

    # -- helpers -----------------------------------------------------------------------------
    def memory_row(self, phase: str) -> None:
        self.tables["memory"].append(self.memory.row(self.step, phase, self.rank))
