"""Did the model memorise its one batch, and if not, why: pure functions of the overfit mode's
facts (see OverfitMode.facts).

The rule does not depend on the loss's absolute scale. The end of the run is the median over
the last tenth of the steps (at least one), compared with the first step:
- classification (cross_entropy, nll_loss, binary_cross_entropy[_with_logits], ...): every
  sample of the batch predicted right (accuracy 1.0) and the loss down to 10% of its first
  value or less; with label smoothing, whose loss cannot reach 0, accuracy alone.
- regression and every other loss: the loss down to 1% of its first value or less (two orders
  of magnitude).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from torchdoctor.recipes.losses import CLASSIFICATION, REGRESSION

CLASSIFICATION_DROP = 0.1
REGRESSION_DROP = 0.01
RATIO_LOW = 1e-4  # update/weight per step below this: the learning rate is too small
RATIO_HIGH = 1e-1  # above this: too large
RATIO_HEALTHY = 1e-3  # the usual rule of thumb
NAMES_SHOWN = 12


def _finite(values: list[Any]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def loss_kind(names: dict[str, int]) -> str:
    if not names:
        return "unknown"
    name = max(names, key=lambda n: names[n])
    if name in CLASSIFICATION:
        return "classification"
    return "regression" if name in REGRESSION else "other"


def judge(facts: dict[str, Any]) -> dict[str, Any]:
    series = facts["series"]
    losses = series["loss"]
    steps = len(losses)
    kind = loss_kind(facts.get("loss_functions") or {})
    window = max(1, steps // 10)
    out: dict[str, Any] = {"kind": kind, "window": window}
    if steps == 0:
        out.update(passed=False, rule="no step was taken", reason="never_stepped")
        out["suspects"] = []
        return out
    first = losses[0]
    tail = losses[-window:]
    final = statistics.median(tail) if tail and all(v is not None for v in tail) else None
    accuracies = _finite(series.get("accuracy", [])[-window:])
    accuracy = statistics.median(accuracies) if accuracies else None
    out.update(first_loss=first, final_loss=final, final_accuracy=accuracy)
    relative = None
    if first is not None and final is not None and first > 0 and math.isfinite(first):
        relative = final / first if math.isfinite(final) else math.inf
    out["relative_loss"] = relative
    smoothing = float(facts.get("label_smoothing") or 0.0)
    if kind == "classification" and accuracy is not None:
        if smoothing > 0:
            out["rule"] = (
                "classification with label smoothing: accuracy 1.0 on the batch (the loss "
                "cannot reach 0)"
            )
            passed = accuracy >= 1.0
        else:
            out["rule"] = (
                f"classification: accuracy 1.0 on the batch and the loss at most "
                f"{CLASSIFICATION_DROP:g} x its first value"
            )
            passed = accuracy >= 1.0 and relative is not None and relative <= CLASSIFICATION_DROP
    else:
        out["rule"] = f"the loss at most {REGRESSION_DROP:g} x its first value"
        if kind == "classification":
            out["rule"] += " (no accuracy could be read from this loss's inputs)"
        passed = relative is not None and relative <= REGRESSION_DROP
    if first is not None and first <= 0:
        passed = False
        out["rule"] += "; a first loss <= 0 cannot be judged by how far it fell"
    out["passed"] = bool(passed)
    out["suspects"] = suspects(facts, out)
    return out


def suspects(facts: dict[str, Any], verdict: dict[str, Any]) -> list[dict[str, Any]]:
    """The seeds' suspects, in their order, each with its evidence: parameters that do not
    train, a learning rate too small (or too large), the loss's inputs and reduction."""
    out: list[dict[str, Any]] = []
    params = facts.get("params") or []
    stepped = int(facts.get("steps") or 0) > 1
    for kind, data in facts.get("silent") or []:  # what the live checks know for certain
        said = _SILENT.get(kind)
        if said is not None:
            out.append(_suspect(kind, said[0], [], said[1], data))
    certain = bool(out)  # each of these sets the size of the updates by itself

    def names(rows: list[dict[str, Any]]) -> list[str]:
        return [r["name"] for r in rows]

    frozen = [p for p in params if not p["requires_grad"]]
    if frozen:
        out.append(
            _suspect(
                "frozen",
                "parameters with requires_grad=False (frozen)",
                names(frozen),
                "unfreeze them if that was not on purpose: " + _unfreeze(names(frozen)),
                {"count": len(frozen), "elements": sum(p["numel"] for p in frozen)},
            )
        )
    missing = [p for p in params if p["requires_grad"] and p["in_optimizer"] is False]
    if missing:
        out.append(
            _suspect(
                "not_in_optimizer",
                "trainable parameters missing from the optimizer (they never change)",
                names(missing),
                "build the optimizer from all of them: torch.optim.Adam(model.parameters(), "
                "lr=...), or optimizer.add_param_group({'params': [...]}) for the ones added "
                "after it was made",
                {"count": len(missing), "changed": sum(1 for p in missing if p["changed"])},
            )
        )
    trained = [p for p in params if p["requires_grad"] and p["in_optimizer"] is not False]
    no_grad = [p for p in trained if stepped and not p["grad_seen"]]
    if no_grad:
        out.append(
            _suspect(
                "no_gradient",
                "parameters that never received a gradient",
                names(no_grad),
                "the loss does not reach them: the module is not called in forward(), or its "
                "output is cut from the graph (.detach(), .item(), .data, torch.no_grad())",
                {"count": len(no_grad)},
            )
        )
    zero = [p for p in trained if p["grad_seen"] and not p["grad_nonzero"]]
    if zero:
        out.append(
            _suspect(
                "zero_gradient",
                "parameters whose gradient was exactly zero at every step",
                names(zero),
                "the loss does not depend on them: dead ReLUs (all inputs negative), an output "
                "multiplied by zero or masked out, a constant branch",
                {"count": len(zero)},
            )
        )
    ratios = _finite(facts["series"].get("update_ratio", []))
    if ratios and max(ratios) == 0 and out:
        ratios = []  # nothing moved, and the parameters above say why
    if certain:
        ratios = []  # the size of the updates follows from the bug found above
    if ratios:
        ratio = statistics.median(ratios)
        lr = facts.get("lr")
        evidence = {"median_update_ratio": ratio, "lr": lr, "optimizer": facts.get("optimizer")}
        if ratio < RATIO_LOW:
            factor = min(1000.0, RATIO_HEALTHY / ratio) if ratio > 0 else 1000.0
            better = f" (lr={lr:g}: try about {lr * factor:.2g})" if lr else ""
            out.append(
                _suspect(
                    "lr_too_small",
                    f"a learning rate too small: each update moves the weights by {ratio:.1e} "
                    f"of their size (around {RATIO_HEALTHY:g} is healthy)",
                    [],
                    f"raise the learning rate{better}",
                    evidence,
                )
            )
        elif ratio > RATIO_HIGH and not verdict.get("passed"):
            out.append(
                _suspect(
                    "lr_too_large",
                    f"a learning rate too large: each update moves the weights by {ratio:.1e} "
                    f"of their size (around {RATIO_HEALTHY:g} is healthy)",
                    [],
                    "lower the learning rate" + (f" (lr={lr:g})" if lr else ""),
                    evidence,
                )
            )
    for finding in facts.get("findings") or []:
        said = _FINDINGS.get(finding["kind"])
        if said is not None:
            out.append(_suspect(finding["kind"], said[0], [], said[1], finding))
    reductions = facts.get("reductions") or {}
    if reductions.get("sum") and not verdict.get("passed"):
        out.append(
            _suspect(
                "reduction_sum",
                "the loss uses reduction='sum': its gradient grows with the number of elements, "
                "so a learning rate tuned for 'mean' is that many times too large",
                [],
                "use reduction='mean' (the default), or divide the learning rate by the number "
                "of elements the loss sums over",
                {"reductions": reductions},
            )
        )
    batch = facts.get("batch") or {}
    if batch.get("source") == "calls" and not facts.get("loss_functions"):
        out.append(
            _suspect(
                "targets_not_replayed",
                "the batch was captured at the model's inputs, but no loss function of "
                "torch.nn was called: targets used in a hand-written loss were not replayed "
                "and may change from step to step",
                [],
                "use a DataLoader, or a torch.nn loss (F.mse_loss(out, y)) so that the targets "
                "repeat too",
                {},
            )
        )
    return out


# The silent-error checks' facts (telemetry/silent/) that explain a batch not memorised.
_SILENT = {
    "grad_not_cleared": (
        "gradients never cleared between updates: optimizer.zero_grad() is missing, so every "
        "update applies all earlier gradients again",
        "call optimizer.zero_grad() once per update (before the forward pass or after step())",
    ),
    "detached_loss": (
        "the loss reaches none of the optimizer's parameters: it was computed from detached "
        "values and made to require grad again",
        "compute the loss from the model's output tensor (no .item(), .detach(), .data)",
    ),
    "ineffective_update": (
        "optimizer.step() leaves the weights unchanged although they have gradients",
        "update the parameters in place in the optimizer (p.add_(...)), and build it from the "
        "parameters the model uses",
    ),
    "accumulation": (
        "gradient accumulation that scales the update wrongly",
        "divide each micro-batch's loss by their number; clear gradients after step() only",
    ),
}
# (Parameters left out of the optimizer and a loss fed the wrong inputs are this mode's own
# suspects, not_in_optimizer and the loss findings, so their silent facts are not repeated.)

_FINDINGS = {
    "probabilities_into_cross_entropy": (
        "probabilities into cross_entropy: its inputs are already softmaxed (each row sums to "
        "1), and CrossEntropyLoss applies log_softmax itself, so the loss can hardly fall",
        "pass the raw logits: drop the softmax before CrossEntropyLoss",
    ),
    "probabilities_into_nll_loss": (
        "probabilities into nll_loss: NLLLoss expects log-probabilities",
        "use log_softmax instead of softmax (or CrossEntropyLoss on the logits)",
    ),
    "logits_into_nll_loss": (
        "raw scores into nll_loss: NLLLoss expects log-probabilities (all <= 0) and is "
        "unbounded below on raw scores",
        "apply log_softmax(dim=1) before NLLLoss, or use CrossEntropyLoss on the logits",
    ),
    "probabilities_into_bce_with_logits": (
        "probabilities into binary_cross_entropy_with_logits: it applies the sigmoid itself",
        "pass the raw logits (drop the sigmoid), or use BCELoss on probabilities",
    ),
    "targets_outside_0_1": (
        "binary cross-entropy targets outside [0, 1]: class labels where 0/1 targets belong",
        "give 0/1 (or probability) targets; for several classes use CrossEntropyLoss",
    ),
    "broadcast_target": (
        "the prediction and the target have different shapes, and the loss broadcasts them: "
        "every prediction is compared with every target",
        "make the shapes equal: out.squeeze(-1) for (N, 1) against (N,), or y.unsqueeze(1)",
    ),
    "float_class_targets": (
        "float targets of another shape than the logits for a classification loss",
        "class indices as int64 (y.long()), or probabilities of the logits' shape",
    ),
}


def _suspect(
    kind: str, title: str, params: list[str], fix: str, evidence: dict[str, Any]
) -> dict[str, Any]:
    return {"kind": kind, "title": title, "params": params, "fix": fix, "evidence": evidence}


def _unfreeze(names: list[str]) -> str:
    modules = sorted({n.rsplit(".", 1)[0] for n in names})
    if len(modules) == 1:
        return f'for p in model.get_submodule("{modules[0]}").parameters(): p.requires_grad_(True)'
    return "p.requires_grad_(True) for each of them"
