"""`loss_inputs`: a loss function given inputs that do not line up with what it expects, read
from the loss's autograd graph (telemetry/silent/loss_graph.py):

- `nll_on_probabilities`: nll_loss (NLLLoss) fed softmax probabilities, not log-probabilities;
- `log_softmax_axis`: log_softmax over another axis than the class axis nll_loss reads (1);
- `softmax_before_cross_entropy`: softmax applied before cross_entropy, which applies
  log_softmax itself (softmax twice);
- `sigmoid_before_bce_with_logits`: a sigmoid applied before BCEWithLogitsLoss, which applies
  one itself (sigmoid twice: every prediction squeezed into (0.5, 0.73));
- `single_class`: log_softmax over an axis of one element (cross_entropy on a model with one
  output, as in a regression written with the classification loss): it is 0 whatever the
  model outputs, so the loss is constant and gives no gradient;
- `class_axis`: class probabilities along the last axis of a 3-d input, where cross_entropy
  reads classes along axis 1;
- `flatten_order`: logits flattened from a time-major [T, N, C] tensor, targets from a
  batch-major [N, T] one: predictions and labels pair up wrongly;
- `broadcast`: predictions and targets of different shapes broadcast by an elementwise loss
  (a [N, 1] prediction against [N] targets compares every prediction with every target).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torchdoctor.diagnose.evidence import Evidence, kind
from torchdoctor.diagnose.inputs import Inputs
from torchdoctor.diagnose.record import Diagnosis
from torchdoctor.frames import short_site


@kind("loss_inputs")
@dataclasses.dataclass(kw_only=True)
class LossInputsEvidence(Evidence):
    logits: list[int]
    targets: list[int]
    problem: str
    step: int
    site: str


def diagnose(inputs: Inputs) -> list[Diagnosis]:
    out = []
    for event in inputs.events_of("silent.loss_inputs"):
        d = event["data"]
        problem = d.get("problem")
        where = short_site(d.get("site"))
        summary, fix = _words(problem, d)
        out.append(
            Diagnosis(
                kind="loss_inputs",
                severity="warning" if problem == "broadcast" else "error",
                step=d.get("step"),
                location=where,
                summary=summary + (f" (the loss backward() runs on at {where})" if where else ""),
                evidence=LossInputsEvidence.from_json(d),
                fix=fix,
                key=f"loss_inputs:{problem}:{where}",
            )
        )
    return out


def _words(problem: Any, d: dict[str, Any]) -> tuple[str, list[str]]:
    shape = tuple(d.get("shape") or [])
    if problem == "nll_on_probabilities":
        return (
            f"nll_loss is given softmax probabilities {shape}, not log-probabilities: the "
            "loss is -p instead of -log p, with gradients that vanish as p goes to 0.",
            [
                "use log_softmax instead of softmax before NLLLoss, or give the raw logits to "
                "CrossEntropyLoss",
            ],
        )
    if problem == "log_softmax_axis":
        return (
            f"log_softmax normalises over axis {d.get('dim')} of {shape}, but nll_loss reads "
            f"the classes along axis {d.get('class_dim')}: the probabilities are taken across "
            "the wrong axis (across the batch, for dim=0).",
            [f"log_softmax(x, dim={d.get('class_dim')}) (the class axis)"],
        )
    if problem == "softmax_before_cross_entropy":
        return (
            f"softmax is applied before cross_entropy, which applies log_softmax itself: "
            f"softmax twice squashes the logits {shape} into [0, 1] and the gradients shrink.",
            ["give cross_entropy the raw logits (remove the softmax before it)"],
        )
    if problem == "sigmoid_before_bce_with_logits":
        return (
            f"A sigmoid is applied before binary_cross_entropy_with_logits "
            f"(BCEWithLogitsLoss), which applies one itself: the predictions {shape} pass "
            "through two sigmoids, squeezed into (0.5, 0.73), and the gradients shrink.",
            [
                "give BCEWithLogitsLoss the raw logits (remove the model's final sigmoid), or "
                "keep the sigmoid and use BCELoss",
            ],
        )
    if problem == "single_class":
        return (
            f"log_softmax runs over axis {d.get('dim')} of {shape}, which has one element: "
            "with one class it is 0 whatever the model outputs, so the loss is constant and "
            "backward() gives every parameter a zero gradient. The model learns nothing.",
            [
                "one output per sample is a value or a yes/no, not a class: use mse_loss for a "
                "value, binary_cross_entropy_with_logits for a yes/no; for C classes, make the "
                "model output C logits",
            ],
        )
    if problem == "class_axis":
        return (
            f"cross_entropy reads classes along axis 1 of {shape}, but the target "
            "probabilities sum to 1 along the last axis: classes and positions are swapped.",
            [
                "move the class axis to position 1: cross_entropy(logits.transpose(1, -1), "
                "target.transpose(1, -1)), or flatten both to [N * T, C]"
            ],
        )
    if problem == "flatten_order":
        logits, targets = tuple(d.get("logits") or []), tuple(d.get("targets") or [])
        return (
            f"The logits were flattened from {logits} (time-major) and the targets from "
            f"{targets} (batch-major): after flattening, predictions and labels pair up "
            "wrongly.",
            [
                "flatten both in the same order: targets.t().reshape(-1) against "
                "logits.reshape(-1, C), or make the model batch-first (batch_first=True)",
            ],
        )
    prediction, result = tuple(d.get("prediction") or []), tuple(d.get("result") or [])
    return (
        f"{d.get('loss', 'the loss')} broadcasts the prediction {prediction} against targets "
        f"of another shape into {result}: every prediction is compared with every target.",
        [
            "give predictions and targets the same shape: pred.squeeze(-1) against [N] "
            "targets, or target.unsqueeze(-1)",
        ],
    )
