"""The models of a run, as the telemetry hooks them: found as the outermost module calls of
the first step (global module hooks), named with watch(), or, under torch.compile, looked for
in the frames of the code that calls backward() (discovery.py). Each model gets one forward
pre-hook (the start of the forward pass on every step) and its rows in python.modules.

Whether the models draw random numbers (dropout) is known once they are found: only then does
each step keep the CPU random state, which a NaN replay needs to draw the same masks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdoctor.telemetry import discovery
from torchdoctor.telemetry.patches import Hooks

_RANDOM_MODULES = ("Dropout", "RReLU", "Transformer", "MultiheadAttention")


class ModelRoots:
    def __init__(self, models: Any, tables: Any, event: Callable[[str, dict[str, Any]], None]):
        self.models = models
        self.tables = tables
        self.event = event
        self.hooks = Hooks()  # the pre-hook on each model
        self.pending: list[Any] = []  # found in the step in progress: hooked once it ends
        self.random = True  # keep the random state per step (until the models are known)
        self._random_known = False
        self.scanned = False  # looked for models in the training code's frames

    def hook(self, modules: list[Any], pre_hook: Any) -> None:
        for module in modules:
            self.hooks.handle(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
            self.random = self.random or _has_randomness(module)
            for root, label in self.models.models():
                if root is module:
                    self.tables["modules"].extend(self.models.module_rows(module, label))
                    self.event("model", {"name": label, "type": type(module).__name__})

    def found_in_step(self, module: Any) -> None:
        """An outermost module call seen by the global hooks: a model, hooked at the step's
        end (hooking it now would run our pre-hook in the middle of its call)."""
        if self.models.add(module):
            self.pending.append(module)

    def step_ended(self, pre_hook: Any) -> None:
        if self.pending:
            roots, self.pending = self.pending, []
            if not self._random_known:
                self.random, self._random_known = False, True
            self.hook(roots, pre_hook)

    def scan_frames(self, module_cls: Any, frame: Any, pre_hook: Any) -> None:
        """No model call was seen (compiled code, or global hooks off): look at what the
        training code holds, once (again after a new torch.compile)."""
        if self.scanned:
            return
        self.scanned = True
        if self.models.roots():
            return
        found = discovery.modules_in_reach(module_cls, frame)
        new = [m for m in found if self.models.add(m)]
        if new:
            self.hook(new, pre_hook)

    def unfinished_rows(self) -> None:
        """The run ended during the first step: the rows of the models found in it."""
        for module, label in self.models.models():
            if any(module is m for m in self.pending):
                self.tables["modules"].extend(self.models.module_rows(module, label))


def _has_randomness(module: Any) -> bool:
    """Whether a model contains modules that draw random numbers in training mode."""
    for sub in module.modules():
        name = type(sub).__name__
        if any(key in name for key in _RANDOM_MODULES):
            p = getattr(sub, "p", getattr(sub, "dropout", None))
            if not isinstance(p, (int, float)) or p > 0 or "Transformer" in name:
                return True
    return False
