"""The models of a run, as the telemetry hooks them: found as the outermost module calls of
the first step (global module hooks), named with watch(), or, under torch.compile, looked for
in the frames of the code that calls backward() (discovery.py). Each model gets a forward
pre-hook and a forward hook (its top-level call is the forward phase, on every step) and its
rows in python.modules; a root without parameters (a loss module) gets a pre-hook that keeps
its calls for a NaN replay.

Whether the models draw random numbers (dropout) is known once they are found: only then does
each step keep the state of the generator they draw from (the CPU's; the GPU's once the first
step is seen to run there), which a NaN replay needs to draw the same masks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchdoctor.frames import caller_frame
from torchdoctor.telemetry import discovery
from torchdoctor.telemetry.models import has_params
from torchdoctor.telemetry.patches import Hooks

if TYPE_CHECKING:
    from types import FrameType

    from torchdoctor.store.tables import Tables
    from torchdoctor.telemetry.torch_hooks import ModelHooks

_RANDOM_MODULES = ("Dropout", "RReLU", "Transformer", "MultiheadAttention")


class ModelRoots:
    def __init__(
        self,
        models: Any,
        tables: Tables,
        event: Callable[[str, dict[str, Any]], None],
        generator: Any = None,
    ) -> None:
        self.models = models
        self.tables = tables
        self.event = event
        self.hooks = Hooks()  # the hooks on each root
        self._model_handles: list[tuple[Any, Any]] = []  # each model's (pre, post) handles
        self._hooked: set[int] = set()  # ids of the roots hooked
        self.pending: list[Any] = []  # found in the step in progress: hooked once it ends
        self.random = True  # keep the random state per step (until the models are known)
        self._source = generator  # the generator dropout draws from: the CPU's, or the GPU's
        self.generator: Any = generator  # what a step keeps the state of (None: nothing)
        self._random_known = False
        self.scanned = False  # looked for models in the training code's frames
        self.call_site: tuple[str, int] | None = None  # the line that called the first model
        # loss_site's last walk: (its first frame's code, frames up, the code found, whether it
        # is the user's, the offset there, the site it gave); native/steady.cpp reads it too
        self.last_walk: tuple[Any, int, Any, bool, int, Any] = (None, 0, None, False, -1, None)

    def hook(self, modules: list[Any], hooks: ModelHooks) -> None:
        """Put `hooks` (torch_hooks.ModelHooks) on each of `modules`."""
        for module in modules:
            if id(module) in self._hooked:
                continue
            self._hooked.add(id(module))
            if has_params(module):
                pre = module.register_forward_pre_hook(hooks.pre, with_kwargs=True)
                post = module.register_forward_hook(hooks.post, always_call=True)
                self.hooks.handle(pre)
                self.hooks.handle(post)
                self._model_handles.append((pre, post))
            else:
                self.hooks.handle(module.register_forward_pre_hook(hooks.loss, with_kwargs=True))
            self.random = self.random or _has_randomness(module)
            self._draws()
            for root, label in self.models.models():
                if root is module:
                    self.tables["modules"].extend(self.models.module_rows(module, label))
                    self.event("model", {"name": label, "type": type(module).__name__})

    def use(self, hooks: ModelHooks) -> None:
        """The models hooked so far get `hooks`' pre and post in place of theirs (the Python
        twins of the compiled hooks, at the first torch.compile: torch_hooks.py)."""
        for pre, post in self._model_handles:
            self.hooks.replace(pre, hooks.pre)
            self.hooks.replace(post, hooks.post)

    def found_in_step(self, module: Any, frame: FrameType) -> None:
        """An outermost module call seen by the global hooks (`frame`: a frame inside the
        call): a model, hooked at the step's end (hooking it now would run our pre-hook in the
        middle of its call). The code that called it names it when it holds it in a module of
        its own (Lightning's `self.net` in training_step: `net`, its modules `net.0`, ...), and
        its line is where the step's loss is said to be, when a library calls backward()."""
        caller, _mine = caller_frame(frame)
        if self.models.add(module, held_as=discovery.path_in_owner(module, caller)):
            self.pending.append(module)

    def note_call_site(self, module: Any, frame: FrameType) -> None:
        """The line that called a model (`frame`: a frame inside its outermost call), the first
        time one is seen: where a library's backward() call is said to be (loss_site)."""
        caller, _mine = caller_frame(frame)
        if caller is not None and has_params(module):
            self.call_site = (caller.f_code.co_filename, caller.f_lineno)

    def loss_site(self, frame: FrameType) -> tuple[str, int] | None:
        """Where the loss backward() runs on is said to be: the line that called backward()
        when it is the user's; when a library calls it (Lightning's automatic optimization, HF
        Trainer, Accelerate), the line that called the model (training_step; compute_loss
        under HF Trainer), never the launcher's (`trainer.fit(...)`)."""
        # Most steps call backward() from the same line as the last: the walk is taken again
        # only where the frames it went through are not the same code as last time's, and the
        # line is worked out again (a search of the code's line table) only for another offset.
        code, up, found, mine, lasti, site = self.last_walk
        if frame.f_code is code:
            caller: FrameType | None = frame
            for _ in range(up):  # the same code may be called from a shallower stack now
                caller = caller.f_back if caller is not None else None
            if caller is not None and caller.f_code is found:
                if not (mine or self.call_site is None):
                    return self.call_site
                if caller.f_lasti == lasti:
                    return site
                site = (found.co_filename, caller.f_lineno)
                self.last_walk = (code, up, found, mine, caller.f_lasti, site)
                return site
        caller, mine = caller_frame(frame)
        if caller is None:
            return self.call_site
        up = 0
        walked: FrameType | None = frame
        while walked is not caller and walked is not None:  # caller is one of frame's callers
            walked, up = walked.f_back, up + 1
        site = (caller.f_code.co_filename, caller.f_lineno)
        self.last_walk = (frame.f_code, up, caller.f_code, mine, caller.f_lasti, site)
        return site if mine or self.call_site is None else self.call_site

    def draw_from(self, generator: Any) -> None:
        """The steps run on a GPU: dropout draws from its generator."""
        self._source = generator
        self._draws()

    def _draws(self) -> None:
        self.generator = self._source if self.random else None

    def is_hooked(self, module: Any) -> bool:
        return id(module) in self._hooked

    def step_ended(self, hooks: ModelHooks) -> None:
        if self.pending:
            roots, self.pending = self.pending, []
            if not self._random_known:
                self.random, self._random_known = False, True
                self._draws()
            self.hook(roots, hooks)

    def scan_frames(self, module_cls: Any, frame: FrameType, hooks: ModelHooks) -> None:
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
            self.hook(new, hooks)

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
