"""Which steps see every module call: the discovery step (the first one, or the first after
rediscover(): its outermost module calls are the models) and the traced steps (one in
--trace-every, or one a diagnosis asks for). Global module hooks are on for those steps only:
on the others the models' own pre-hooks are all there is, and under torch.compile never
(Dynamo would trace them, and adding or removing them changes its guards).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from torchdoctor.telemetry import torch_hooks
from torchdoctor.telemetry.models import has_params
from torchdoctor.telemetry.patches import Hooks


class TracePlan:
    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.tracing = False  # this step's module calls go to python.torch_trace
        self.shaping = True  # ... and to python.shapes (the discovery step and traced steps)
        self.discovering = True  # this step's outermost module calls are the models
        self.requested = False  # a diagnosis asked for the next step to be traced
        self.depth = 0  # nesting of module calls, while the global hooks are on
        self.opened: Any = None  # a model not hooked yet whose call opened the forward phase
        self.hooks = Hooks()
        self.hooks_on = False

    def global_hooks(self, on: bool) -> None:
        self.depth = 0
        self.opened = None
        if on and not self.hooks_on:
            torch_hooks.add_global_module_hooks(self, self.hooks)
        elif not on:
            self.hooks.remove()
        self.hooks_on = on

    def compile_seen(self) -> None:
        self.global_hooks(False)
        self.tracing = self.shaping = False

    def rediscover(self, step: int, compiled: bool) -> None:
        self.discovering = True
        if not compiled:
            self.global_hooks(True)
            self.shaping = True
            self.rec.shapes.begin(step)

    def next_step(self, step: int, every: int, compiled: bool) -> None:
        """Whether step `step` (the next one) is traced."""
        rec = self.rec
        due = every and (every == 1 or step % every == 1)
        # native/steady.cpp asks this same first test before it calls here: keep the two alike
        if not (due or self.requested or self.tracing or self.hooks_on):
            return  # an untraced step after an untraced step (most steps): nothing changes
        tracing = self.requested or (bool(every) and (every == 1 or step % every == 1))
        tracing = tracing and not compiled
        self.requested = False
        if tracing:
            rec.tracer.begin(step, rec.clock)
            rec.shapes.begin(step)
        if tracing != self.hooks_on:
            self.global_hooks(tracing)
        self.tracing = self.shaping = tracing

    # -- the global hooks' events (torch_hooks.global_pre/global_post) ------------------------
    def on_global_pre(self, module: Any, args: Any) -> None:
        rec = self.rec
        top = self.depth == 0
        self.depth += 1
        if top and rec.roots.call_site is None:
            rec.roots.note_call_site(module, sys._getframe())
        if top and not rec.roots.is_hooked(module):
            # an outermost call of a module not hooked yet: a model (or a loss module), seen
            # first here; its own hooks are put on at the step's end
            if has_params(module):
                rec.on_model_call(module, args, {})
                self.opened = module
            else:
                rec.on_loss_call(module, args, {})
            rec.roots.found_in_step(module, sys._getframe())
        if self.shaping:
            rec.shapes.enter(module, rec.models.name_of(module), args)
        if self.tracing:
            rec.tracer.enter(module, rec.models.name_of(module), time.time())

    def on_global_post(self, module: Any, output: Any) -> None:
        self.depth = max(0, self.depth - 1)
        if not self.depth and self.opened is module:
            self.opened = None
            self.rec.on_model_return(time.perf_counter())
        if self.shaping:
            self.rec.shapes.exit(module, output)
        if self.tracing:
            self.rec.tracer.exit(module, output)
