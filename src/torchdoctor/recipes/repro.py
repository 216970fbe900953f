"""The repro mode in the training process: for each of the first N steps, the exact contents
(digests) of every torch op's output on the training thread with the module it ran in and its
call site, the batch given to the model, the loss, the gradient norm, every parameter and its
gradient; the parameters as they were when the model was first called; and the sources of
randomness drawn from without a seed (randomness.py). The verb runs two such processes and
compares them (compare.py). After `steps` steps the script is stopped (StopTraining).

Ops are seen through a TorchFunctionMode entered before the script starts: functions of torch,
torch.nn.functional and Tensor methods, not the kernels autograd runs in backward (a backward
that differs shows in the gradients)."""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

from torchdoctor.recipes.digest import tensor_digest, value_digest
from torchdoctor.recipes.mode import StopTraining
from torchdoctor.recipes.randomness import Randomness
from torchdoctor.recipes.sites import skip_package, user_site
from torchdoctor.telemetry.invisible import compiling
from torchdoctor.telemetry.patches import Hooks

if TYPE_CHECKING:
    from torchdoctor.telemetry.recorder import Recorder
    from torchdoctor.telemetry.step import StepState

OPS_PER_STEP = 20000  # beyond it a step's ops are counted, not kept
# uninitialised memory: its contents differ from run to run and mean nothing
DATALOADER = "DataLoader"  # the "module" of ops run while a batch is fetched
UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty"})


class ReproMode:
    def __init__(self, recorder: Recorder, torch: Any, steps: int) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )
        from torch.overrides import TorchFunctionMode

        self.rec = recorder
        self.torch = torch
        self.limit = steps
        self.hooks = Hooks()
        self.thread = threading.main_thread().ident
        skip_package(torch)
        if "numpy" in sys.modules:
            skip_package(sys.modules["numpy"])
        self.randomness = Randomness(torch, self.hooks)
        self.armed = True
        self.steps = 0
        self.trace: list[dict[str, Any]] = []
        self._ops: list[list[Any]] = []  # this step: [op, id(module) or None, digest, site]
        self._dropped = 0
        self._batch: list[str | None] = []
        self._stack: list[Any] = []  # the modules whose forward is running
        self._loading = 0  # inside a DataLoader's next()
        self._forward_at: int | None = None  # this step: ops before its first model call
        self._modules: dict[int, Any] = {}
        self.initial: list[list[Any]] | None = None  # [name, digest] at the first model call
        mode = self

        def pre(module: Any, args: Any) -> None:
            if compiling() or threading.get_ident() != mode.thread:
                return
            if not mode._stack:
                if mode._forward_at is None:
                    mode._forward_at = len(mode._ops)
                if mode.initial is None:
                    mode.initial = mode._param_digests(module)
                mode._batch.append(value_digest(torch, list(args)))
            mode._stack.append(module)
            mode._modules.setdefault(id(module), module)

        def post(module: Any, args: Any, output: Any) -> None:
            if compiling() or threading.get_ident() != mode.thread:
                return
            if mode._stack:
                mode._stack.pop()

        self.hooks.handle(register_module_forward_pre_hook(pre))
        self.hooks.handle(register_module_forward_hook(post, always_call=True))
        self._patch_loader(torch)

        class Ops(TorchFunctionMode):
            def __torch_function__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                kwargs = kwargs or {}
                result = func(*args, **kwargs)
                if not compiling() and threading.get_ident() == mode.thread:
                    mode._op(func, args, kwargs, result)
                return result

        self._mode = Ops()
        self._mode.__enter__()
        self.hooks.on_remove(lambda: self._mode.__exit__(None, None, None))
        recorder.step_listeners.append(self._on_step)
        self.hooks.on_remove(lambda: _discard(recorder.step_listeners, self._on_step))

    # -- every op ------------------------------------------------------------------------------
    def _op(self, func: Any, args: Any, kwargs: dict[str, Any], result: Any) -> None:
        name = getattr(func, "__name__", None) or str(func)
        if name in ("__get__", "__set__", "grad", "_version", "data"):
            return  # attribute reads: no new values
        site = user_site(sys._getframe(2))
        if site == "":
            return  # torchdoctor's own work (the Recorder's readings)
        self.randomness.torch_op(name, tuple(args), kwargs, result, site)
        if len(self._ops) >= OPS_PER_STEP:
            self._dropped += 1
            return
        module: Any = self._stack[-1] if self._stack else None
        if module is None and self._loading:
            module = DATALOADER
        digest = None if name in UNINITIALISED else value_digest(self.torch, result)
        self._ops.append([name, id(module) if module is not None else None, digest, site])
        self._modules.setdefault(id(DATALOADER), DATALOADER)

    # -- every step ------------------------------------------------------------------------------
    def _on_step(self, state: StepState, step: int) -> None:
        self.steps = step + 1
        losses = [float(v) for v in state.step_losses()]
        norm = state.grad_norm_value
        if norm is None and state.grad_norm is not None:
            norm = float(state.grad_norm)
        params = self._all_params()
        torch = self.torch
        with torch.no_grad():
            self.trace.append(
                {
                    "loss": losses,
                    "grad_norm": norm,
                    "batch": self._batch,
                    "params": [[n, tensor_digest(torch, p)] for n, p in params],
                    "grads": [
                        [n, tensor_digest(torch, p.grad) if p.grad is not None else None]
                        for n, p in params
                    ],
                    "ops": self._ops,
                    "forward_at": self._forward_at,
                    "ops_dropped": self._dropped,
                }
            )
        self._ops, self._batch, self._dropped, self._forward_at = [], [], 0, None
        if self.steps >= self.limit and self.armed:
            raise StopTraining

    def _patch_loader(self, torch: Any) -> None:
        """Ops run while a DataLoader fetches a batch (its sampler's shuffle, a dataset's
        transforms in the main process) are labelled DataLoader."""
        from torch.utils.data import dataloader as dl

        base = dl._BaseDataLoaderIter
        inner = base.__dict__["__next__"]
        mode = self

        def __next__(it: Any) -> Any:
            if compiling() or threading.get_ident() != mode.thread:
                return inner(it)
            mode._loading += 1
            try:
                return inner(it)
            finally:
                mode._loading -= 1

        self.hooks.patch(base, "__next__", __next__)

    def _all_params(self) -> list[tuple[str, Any]]:
        out, seen = [], set()
        for model, label in self.rec.models.models():
            for param in model.parameters():
                if id(param) in seen:
                    continue
                seen.add(id(param))
                named = self.rec.models.param_name(param)
                out.append((f"{named[0]}.{named[1]}" if named else f"{label}.?", param))
        return out

    def _param_digests(self, module: Any) -> list[list[Any]]:
        with self.torch.no_grad():
            return [[n, tensor_digest(self.torch, p)] for n, p in module.named_parameters()]

    # -- the end --------------------------------------------------------------------------------
    def disarm(self) -> None:
        self.armed = False

    def remove(self) -> None:
        self.hooks.remove()

    def result(self) -> dict[str, Any]:
        names = {
            i: m if isinstance(m, str) else self.rec.models.name_of(m)
            for i, m in self._modules.items()
        }
        for row in self.trace:
            for op in row["ops"]:
                op[1] = names.get(op[1]) if op[1] is not None else None
        types = {
            names[i]: m if isinstance(m, str) else type(m).__name__
            for i, m in self._modules.items()
        }
        return {
            "module_types": types,
            "steps": self.steps,
            "limit": self.limit,
            "initial_params": self.initial or [],
            "trace": self.trace,
            **self.randomness.facts(),
        }


def _discard(items: list[Any], item: Any) -> None:
    if item in items:
        items.remove(item)
