"""Train and eval modes: a model trained in eval mode, a train() override never called, and
dropout that stays on when the model is in eval mode.

- eval mode while training: at the first backward() of a sampled step, a model whose
  parameters an optimizer holds, called in that step (a k-fold run's other folds' models sit
  in eval mode after their validation), is in eval mode (`model.training` is False): its dropout is
  off and its batch-norm layers use their running statistics instead of the batch's (and do
  not update them). Said after two sampled steps, with the modules whose behaviour the mode
  changes (and the functional dropout calls its evaluation passes turned off: a module that
  calls F.dropout(..., training=self.training) has no Dropout module to count) and the line of
  the `.eval()` that put it there (the lookups of nn.Module.train are
  watched: where the latest outermost train()/eval() call reaching a module came from,
  hooks.py).
- train() never called: a module class that overrides `train()` (to freeze stages, to keep
  batch-norm layers in eval mode) expects the training loop to call `model.train()`; when
  the first sampled step comes and it never was (the module starts in training mode without
  it), the override's work was never done.
- dropout in eval mode: the first two calls of a model in eval mode, then one in 500, run
  under a TorchFunctionMode that sees every functional dropout and scaled_dot_product_attention
  call: one with `training=True` or `dropout_p > 0` while the model is in eval mode is dropout
  its module forgot to turn off (it should pass `self.training`); one with `training=False`
  and p > 0 is dropout the mode turns off, noted for the eval-mode finding above.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from torchdoctor.frames import site, user_frame
from torchdoctor.telemetry.as_caller import call_as_caller

if TYPE_CHECKING:
    from types import FrameType


CONFIRM = 2
WATCH_EVERY = 500  # eval-mode model calls between two watched ones (after the first two)
FUNCTIONAL_SITES = 8  # functional dropout call sites kept per model


class Modes:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.told: set[int] = set()  # ids of modules a train()/eval() call reached
        self.sites: dict[int, str | None] = {}  # module id -> the latest train()/eval() call
        self.original_train: Any = None  # nn.Module.train (the function)
        self.eval_calls = 0
        self.in_eval: dict[str, int] = {}  # model -> sampled steps seen training in eval mode
        # model -> {call site: p} of the functional dropout its eval mode turned off
        self.turned_off: dict[str, dict[str, float]] = {}
        self.backward_step = -1
        self.overrides_checked = False
        self.watch: Any = None  # the DropoutWatch mode while an eval call runs under it
        self.stale: list[Any] = []  # forward-hook handles to remove at the next chance
        self._watch_cls: Any = None

    # -- nn.Module.train (hooks.py): the outermost call of a train()/eval() ----------------------
    def on_train(self, module: Any, frame: FrameType) -> None:
        where = site(user_frame(frame))
        for m in module.modules():
            self.told.add(id(m))
            self.sites[id(m)] = where

    # -- at the first backward() of a sampled step ---------------------------------------------
    def on_backward(self) -> None:
        self._drop_stale()
        rec = self.host.rec
        if self.backward_step == rec.step:
            return
        self.backward_step = rec.step
        self._eval_training()
        if not self.overrides_checked:
            self.overrides_checked = True
            self._overrides()

    def _eval_training(self) -> None:
        rec = self.host.rec
        ids = self.host.param_ids()
        models = rec.models.models()
        called = {id(module) for module, _args, _kwargs in rec.state.tape}
        for root, label in models:
            if root.training:
                self.in_eval.pop(label, None)
                continue
            if any(root is not m and _contains(m, root) for m, _ in models):
                continue  # a part of another model called on its own (a parametrization)
            if not any(id(p) in ids for p in root.parameters()):
                continue  # a teacher, a target network: no optimizer trains it
            if called and id(root) not in called:
                continue  # not in this step: another fold's model, evaluated and put away
            count = self.in_eval.get(label, 0) + 1
            self.in_eval[label] = count
            if count < CONFIRM:
                continue
            data = {
                "model": label,
                "step": rec.step,
                "modules": _mode_dependent(root, self.turned_off.get(label, {})),
                "eval_site": self.sites.get(id(root)),
                "site": self.host.user_site(),
            }
            self.host.emit("eval_mode", data, key=label)

    def _overrides(self) -> None:
        plain = (self.original_train,)
        for root, label in self.host.rec.models.models():
            missed = []
            for name, module in root.named_modules():
                train = type(module).train
                if train in plain or id(module) in self.told or _torch_own(type(module)):
                    continue
                code = getattr(train, "__code__", None)
                where = f"{code.co_filename}:{code.co_firstlineno}" if code else None
                missed.append(
                    {"module": name or label, "class": type(module).__name__, "override": where}
                )
            if missed:
                data = {"model": label, "step": self.host.rec.step, "modules": missed[:8]}
                data["count"] = len(missed)
                self.host.emit("train_not_called", data, key=label)

    # -- a model called in eval mode -------------------------------------------------------------
    def on_eval_call(self, module: Any) -> None:
        self._drop_stale()
        self.eval_calls += 1
        n = self.eval_calls
        if self.watch is not None or not (n <= 2 or n % WATCH_EVERY == 0):
            return
        if next(module.parameters(), None) is None:
            return
        watch = self._watch_class()(self, self.host.rec.models.name_of(module))
        watch.__enter__()
        self.watch = watch
        holder: list[Any] = []

        def ended(_module: Any, _args: Any, _output: Any) -> None:
            self._end_watch(watch)
            if sys.exc_info()[0] is None and holder:  # torch iterates a copy of the hooks
                holder.pop().remove()
            elif holder:  # the forward raised: torch iterates the hooks themselves
                self.stale.append(holder.pop())

        holder.append(module.register_forward_hook(ended, always_call=True))

    def _end_watch(self, watch: Any) -> None:
        if self.watch is not watch:
            return
        torch = self.host.torch
        depth = torch._C._len_torch_function_stack()
        if depth and torch._C._get_function_stack_at(depth - 1) is watch:
            watch.__exit__(None, None, None)
            self.watch = None
        # else another mode was pushed above it and not popped: leave both alone

    def dropout_seen(self, model: str, op: str, p: float, on: bool, frame: FrameType) -> None:
        """A dropout call of `model` in eval mode: left on (a finding), or turned off by the
        mode (noted: the model has dropout that training in eval mode would lose)."""
        where = site(user_frame(frame))
        if not on:
            sites = self.turned_off.setdefault(model, {})
            if where and len(sites) < FUNCTIONAL_SITES:
                sites.setdefault(where, p)
            return
        data = {"model": model, "op": op, "p": p, "site": where, "step": self.host.rec.step}
        self.host.emit("dropout_in_eval", data, key=where)

    def _watch_class(self) -> Any:
        if self._watch_cls is None:
            self._watch_cls = _make_watch(self.host.torch)
        return self._watch_cls

    def _drop_stale(self) -> None:
        if self.watch is not None:
            self._end_watch(self.watch)
        while self.stale:
            self.stale.pop().remove()

    def remove(self) -> None:
        self._drop_stale()


def _torch_own(cls: type) -> bool:
    """A class of torch itself: its train() override (DistributedDataParallel's, which passes
    the mode on to the module it wraps) sets up nothing a training must not miss."""
    return (getattr(cls, "__module__", "") or "").split(".")[0] == "torch"


def _make_watch(torch: Any) -> Any:
    from torch.overrides import TorchFunctionMode

    F = torch.nn.functional
    training_at = {  # function -> index of its `training` argument
        f: 2
        for f in (
            F.dropout,
            F.dropout1d,
            F.dropout2d,
            F.dropout3d,
            F.alpha_dropout,
            F.feature_alpha_dropout,
            torch.dropout,
            torch.alpha_dropout,
            torch.feature_dropout,
            torch.feature_alpha_dropout,
        )
    }
    sdpa = F.scaled_dot_product_attention

    class DropoutWatch(TorchFunctionMode):
        """Sees every torch function an eval-mode model calls; notes dropout left on."""

        def __init__(self, modes: Modes, model: str) -> None:
            super().__init__()
            self.modes = modes
            self.model = model

        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            try:
                p, on = self._dropout(func, args, kwargs)
                if p > 0:
                    self.modes.dropout_seen(self.model, func.__name__, p, on, sys._getframe(1))
            except Exception:
                pass
            return call_as_caller(sys._getframe(1), func, args, kwargs)

        @staticmethod
        def _dropout(func: Any, args: Any, kwargs: dict[str, Any]) -> tuple[float, bool]:
            """A call's dropout probability and whether it drops out ((0.0, False) for a call
            that is no dropout; attention's dropout_p is on whenever it is above 0)."""
            at = training_at.get(func)
            if at is not None:
                default = args[at] if len(args) > at else True
                on = kwargs.get("training", kwargs.get("train", default))
                p = float(kwargs.get("p", args[1] if len(args) > 1 else 0.5))
                return p, bool(on)
            if func is sdpa:
                p = float(kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0))
                return p, True
            return 0.0, False

    return DropoutWatch


def _contains(model: Any, module: Any) -> bool:
    return any(m is module for m in model.modules())


def _mode_dependent(root: Any, turned_off: dict[str, float]) -> dict[str, Any]:
    """What eval mode changes in `root`, by kind: counts and a few names; its modules, and
    `functional_dropout`: the call sites of the dropout its evaluation passes turned off."""
    kinds: dict[str, list[str]] = {}
    for name, module in root.named_modules():
        kind = _kind(module)
        if kind:
            kinds.setdefault(kind, []).append(name or type(module).__name__)
    if turned_off:
        kinds["functional_dropout"] = list(turned_off)
    return {k: {"count": len(v), "names": v[:4]} for k, v in kinds.items()}


def _kind(module: Any) -> str | None:
    cls = type(module).__name__
    if "Dropout" in cls:
        return "dropout" if float(getattr(module, "p", 0) or 0) > 0 else None
    if (
        cls == "MultiheadAttention"
        or cls.startswith("TransformerEncoderLayer")
        or cls.startswith("TransformerDecoderLayer")
    ):
        return None  # their dropout is a Dropout submodule or a functional one seen by name
    if "BatchNorm" in cls or cls.startswith("InstanceNorm"):
        return "batch_norm" if getattr(module, "track_running_stats", False) else None
    if cls == "RReLU":
        return "rrelu"
    if hasattr(module, "weight_u") or _has_spectral_norm(module):
        return "spectral_norm"
    return None


def _has_spectral_norm(module: Any) -> bool:
    params = getattr(module, "parametrizations", None)
    if params is None:
        return False
    return any("SpectralNorm" in type(p).__name__ for ps in params.values() for p in ps)
