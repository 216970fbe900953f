"""The loss functions a script calls, watched in the overfit mode: which loss (so which rule
judges memorisation), its reduction, the accuracy on the batch for a classification loss, and
what its inputs say about common mistakes (probabilities into CrossEntropyLoss, a target that
broadcasts against the prediction). torch.nn's loss modules call these same functions, so
both ways of writing a loss are seen."""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

from torchdoctor.telemetry.invisible import compiling

if TYPE_CHECKING:
    from torchdoctor.telemetry.patches import Hooks

CLASSIFICATION = {
    "cross_entropy",
    "nll_loss",
    "binary_cross_entropy",
    "binary_cross_entropy_with_logits",
    "multilabel_soft_margin_loss",
    "soft_margin_loss",
    "multi_margin_loss",
}
REGRESSION = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"}
WATCHED = sorted(CLASSIFICATION | REGRESSION | {"kl_div", "poisson_nll_loss", "gaussian_nll_loss"})


class LossCall:
    """What one loss call showed: its name, reduction, the accuracy it allows, the findings."""

    __slots__ = ("accuracy", "findings", "label_smoothing", "name", "reduction")

    def __init__(self, name: str, reduction: str, label_smoothing: float) -> None:
        self.name = name
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.accuracy: float | None = None
        self.findings: list[dict[str, Any]] = []


class LossWatch:
    def __init__(self, torch: Any, hooks: Hooks, depth: Any, replay: Any) -> None:
        self.torch = torch
        self.thread = threading.main_thread().ident
        self.last: LossCall | None = None  # the step's last loss call
        self.names: dict[str, int] = {}  # loss name -> calls
        self.reductions: dict[str, int] = {}
        self.sums: list[float] = []  # this step's losses with reduction='sum', as values
        self.findings: dict[str, dict[str, Any]] = {}  # kind -> the first evidence of it
        self.label_smoothing = 0.0
        functional = torch.nn.functional
        for name in WATCHED:
            original = getattr(functional, name, None)
            if original is not None:
                hooks.patch(functional, name, self._wrap(name, original, depth, replay))

    def _wrap(self, name: str, original: Any, depth: Any, replay: Any) -> Any:
        watch = self

        @functools.wraps(original)
        def loss(*args: Any, **kwargs: Any) -> Any:
            if compiling() or threading.get_ident() != watch.thread:
                return original(*args, **kwargs)
            changed = replay.loss_call(list(args), inside_module=depth.level > 0)
            if changed is not None:
                args = tuple(changed)
            try:
                watch._observe(name, args, kwargs)
            except Exception:  # a finding is a nicety: never the reason the script fails
                pass
            out = original(*args, **kwargs)
            if kwargs.get("reduction") == "sum":
                watch._summed(out)
            return out

        return loss

    def _summed(self, out: Any) -> None:
        """A loss summed over its elements: whether backward() runs on the sum itself is told
        at the step's end (step_ended), against the loss backward() ran on."""
        try:
            if isinstance(out, self.torch.Tensor) and out.numel() == 1:
                self.sums.append(float(out.detach()))
        except Exception:
            pass

    def step_ended(self, losses: list[Any]) -> None:
        """The losses backward() ran on this step: a sum that is one of them counts as
        reduction='sum'; one divided before backward() (Hugging Face's causal-LM loss sums,
        then divides by the number of items) is a mean, as far as the gradient is concerned."""
        if not self.sums:
            return
        ran = []
        for value in losses:
            try:
                ran.append(float(value))
            except (TypeError, ValueError):
                continue
        for total in self.sums:
            same = any(abs(total - v) <= 1e-4 * max(abs(total), abs(v), 1e-12) for v in ran)
            kind = "sum" if same else "sum, divided before backward()"
            self.reductions[kind] = self.reductions.get(kind, 0) + 1
        self.sums = []

    def _observe(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        torch = self.torch
        prediction = args[0] if args else kwargs.get("input")
        target = args[1] if len(args) > 1 else kwargs.get("target")
        reduction = str(kwargs.get("reduction", "mean"))
        smoothing = float(kwargs.get("label_smoothing", 0.0) or 0.0)
        call = LossCall(name, reduction, smoothing)
        self.names[name] = self.names.get(name, 0) + 1
        if reduction != "sum":  # a sum is counted at the step's end (step_ended)
            self.reductions[reduction] = self.reductions.get(reduction, 0) + 1
        self.label_smoothing = max(self.label_smoothing, smoothing)
        self.last = call
        if not isinstance(prediction, torch.Tensor) or not isinstance(target, torch.Tensor):
            return
        with torch.no_grad():
            p = prediction.detach()
            t = target.detach()
            call.accuracy = _accuracy(name, p, t, kwargs)
            for finding in _findings(name, p, t):
                self.findings.setdefault(finding["kind"], finding)


def _accuracy(name: str, p: Any, t: Any, kwargs: dict[str, Any]) -> float | None:
    if name in ("cross_entropy", "nll_loss") and p.dim() >= 2:
        pred = p.argmax(1)
        truth = t.argmax(1) if t.is_floating_point() and t.shape == p.shape else t
        if truth.shape != pred.shape:
            return None
        keep = truth != int(kwargs.get("ignore_index", -100))
        total = int(keep.sum())
        return float(((pred == truth) & keep).sum()) / total if total else None
    if name == "binary_cross_entropy_with_logits" and p.shape == t.shape:
        return float(((p > 0) == (t > 0.5)).float().mean())
    if name == "binary_cross_entropy" and p.shape == t.shape:
        return float(((p > 0.5) == (t > 0.5)).float().mean())
    return None


def _findings(name: str, p: Any, t: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not p.is_floating_point() or p.numel() == 0:
        return out
    low, high = float(p.min()), float(p.max())
    if name in ("cross_entropy", "nll_loss") and p.dim() >= 2 and low >= 0 and high <= 1:
        sums = p.sum(1)
        if bool(((sums - 1).abs() < 1e-3).all()):
            out.append(
                {
                    "kind": "probabilities_into_" + name,
                    "min": low,
                    "max": high,
                    "row_sum": float(sums.mean()),
                }
            )
    if name == "nll_loss" and high > 0 and "probabilities_into_nll_loss" not in str(out):
        out.append({"kind": "logits_into_nll_loss", "min": low, "max": high})
    if name == "binary_cross_entropy_with_logits" and low >= 0 and high <= 1:
        out.append({"kind": "probabilities_into_bce_with_logits", "min": low, "max": high})
    if name in ("binary_cross_entropy", "binary_cross_entropy_with_logits") and t.numel():
        t_low, t_high = float(t.min()), float(t.max())
        if t_low < 0 or t_high > 1:
            out.append({"kind": "targets_outside_0_1", "min": t_low, "max": t_high})
    if name in REGRESSION and tuple(p.shape) != tuple(t.shape):
        out.append(
            {
                "kind": "broadcast_target",
                "input_shape": list(p.shape),
                "target_shape": list(t.shape),
            }
        )
    if name in ("cross_entropy", "nll_loss") and t.is_floating_point() and t.shape != p.shape:
        out.append({"kind": "float_class_targets", "target_dtype": str(t.dtype)})
    return out
