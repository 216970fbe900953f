"""The crash capture: when an exception ends the script, read the live traceback before the
process exits and gather what the `crash` diagnosis tells: the explanation (the catalog of
`torchdoctor explain`), the module that raised by its qualified name, the step and phase, the
shapes that flowed into it in that step, and the line of the model's code that builds it.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from torchdoctor.diagnose.crash import CrashEvidence, flow_window
from torchdoctor.diagnose.nan import HUGE_WEIGHT
from torchdoctor.errors.api import explain_exception
from torchdoctor.errors.here import Finding
from torchdoctor.errors.located import locate_explanation
from torchdoctor.failure import (
    definition,
    frames_of,
    locate,
    optimizer_line,
    phase_of,
    user_frame,
)
from torchdoctor.frames import is_user_file, short_site
from torchdoctor.lint.grad_switch import switch_off
from torchdoctor.views import TrainingView

_CONFIG = {
    "Linear": ("in_features", "out_features"),
    "Conv1d": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation"),
    "Conv2d": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation"),
    "Conv3d": ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation"),
}


def capture(exc: BaseException, training: TrainingView | None) -> CrashEvidence:
    facts = _forward_facts(training)
    explanation = explain_exception(exc, process=_process_findings(facts, exc))
    torch = sys.modules.get("torch")
    frames = frames_of(exc)
    place: dict[str, Any] = {}
    phase = None
    if torch is not None and hasattr(torch, "nn"):
        place = locate(frames, training, torch)
        phase = phase_of(frames, torch)
        owner = place.pop("object", None)
        if owner is not None:
            place["config"] = _config(owner)
            place["definition"] = definition(owner, training)
            place["target"] = place["definition"].target if place["definition"] else None
    else:
        user = user_frame(frames)
        if user is not None:
            place = {"file": user.f_code.co_filename, "line": user.f_lineno}
    del frames
    step = training.step if training is not None else None
    if phase is None and training is not None:
        phase = training.phase
        if phase == "other" and not training.steps_done:
            phase = "setup" if not training.model_inputs() else phase
    flow_step, flow, live = training.module_calls() if training is not None else (None, [], False)
    place["optimizer"] = _optimizer(facts, frames_file=place.get("file"))
    located = locate_explanation(explanation, place)
    return CrashEvidence(
        exception=type(exc).__name__,
        message=_message(exc),
        category=explanation.category,
        title=explanation.title,
        explanation=located.summary,
        step=step,
        phase=phase,
        module=place.get("module"),
        module_type=place.get("module_type"),
        location_source=place.get("source"),
        file=place.get("file"),
        line=place.get("line"),
        definition=place.get("definition"),
        inputs=list(place.get("inputs") or []),
        flow=flow_window(flow, place.get("module")),
        flow_step=flow_step,
        flow_live=live and flow_step == step,
        causes=located.causes,
        fixes=located.fixes,
        fields={k: v for k, v in located.fields.items() if _plain(v)},
    )


def _forward_facts(training: TrainingView | None) -> dict[str, Any]:
    if training is None:
        return {}
    try:
        return training.forward_facts()
    except Exception:
        return {}


def _optimizer(facts: dict[str, Any], frames_file: str | None) -> dict[str, Any] | None:
    """The primary optimizer and the line that makes it, looked for in the file of the loop's
    backward() and in the file that failed (for a fix that names the line to change)."""
    info = facts.get("optimizer")
    if not info:
        return None
    files = [f for f in (info.get("loop_file"), frames_file) if f]
    made = optimizer_line(info["label"], info["type"], files)
    return {**info, "lr": facts.get("lr"), "definition": made}


def _process_findings(facts: dict[str, Any], exc: BaseException) -> list[Finding]:
    """What this process knows that a pasted text does not: for a backward() on a tensor with
    no grad_fn, whether the step's forward ran with grad on and which parameters train (all,
    some, none) decide between the graph cut before the loss, no_grad, frozen weights and
    checkpointing;
    for a device-side assert, whether the model looks ids up in an embedding, what fed a BCE
    loss, and whether the last steps' values were lost with the GPU context."""
    if not facts:
        return []
    out = []
    lookups = facts.get("embeddings") or []
    device_assert = "device-side assert" in _message(exc)
    if device_assert:
        out += _device_assert_findings(facts)
    if lookups and device_assert:
        # The message alone cannot tell an id past an embedding's end from a label past the
        # classes; a model that looks ids up runs that kernel first, in its forward.
        names = ", ".join(f"{name} ({size} ids)" for name, size in lookups)
        out.append(Finding(f"the model looks ids up in {names}", rule_in=("embedding",)))
    diverged = _diverged(
        facts.get("losses") or [],
        facts.get("nonfinite_weights") or [],
        float(facts.get("largest_weight") or 0.0),
    )
    if diverged is not None:
        lr = facts.get("lr")
        out.append(
            Finding(
                diverged,
                rule_in=("nan", "bce_nan"),
                rule_out=("logits", "bce"),
                fields={"lr": lr} if lr is not None else {},
            )
        )
    grad, trainable = facts.get("grad_enabled"), facts.get("trainable")
    if facts.get("models") and trainable == 0:
        out.append(Finding("every parameter of the model is frozen", rule_in=("frozen",)))
    elif grad is False:
        switch = _grad_off_switch(exc)
        out.append(
            Finding(
                "the step's forward ran with grad off ("
                + (
                    f"{switch}, around the code that failed)"
                    if switch
                    else "torch.no_grad or inference_mode)"
                ),
                rule_in=("no_grad",),
                rule_out=("detached", "checkpoint_inputs"),
                fields={"grad_off": switch} if switch else {},
            )
        )
    elif grad and trainable and facts.get("frozen_modules") and not facts.get("checkpointing"):
        # Part of the model frozen: a loss that runs through frozen modules only (and the
        # trainable ones' output detached, or not used) has no graph. Said first; the graph
        # cut stays a cause after it.
        frozen = ", ".join(facts["frozen_modules"])
        out.append(
            Finding(
                f"the step's forward ran with grad on; {trainable} parameters train, but every "
                f"parameter of {frozen} is frozen (requires_grad=False)",
                rule_in=("frozen",),
                rule_out=("no_grad", "checkpoint_inputs"),
                fields={"frozen_modules": frozen},
            )
        )
    elif grad and trainable:
        ruled_out = ("no_grad", "frozen") + (
            () if facts.get("checkpointing") else ("checkpoint_inputs",)
        )
        out.append(
            Finding(
                f"the step's forward ran with grad on and {trainable} parameters train, so "
                "the graph was cut between the model's output and the loss",
                rule_in=("checkpoint_inputs",) if facts.get("checkpointing") else ("detached",),
                rule_out=ruled_out,
            )
        )
    return out


def _grad_off_switch(exc: BaseException) -> str | None:
    """The user's `with torch.no_grad():` (or decorator) that switched autograd off for the
    code that failed, and where (lint/grad_switch.py reads the traceback's sources)."""
    places = [
        (f.f_code.co_filename, f.f_lineno, f.f_code.co_name)
        for f in reversed(frames_of(exc))
        if is_user_file(f.f_code.co_filename)
    ]
    found = switch_off(places)
    return f"`{found[2]}` at {short_site(f'{found[0]}:{found[1]}')}" if found else None


# autograd nodes whose outputs lie in [0, 1] (NaN aside)
_BOUNDED = ("SigmoidBackward0", "HardsigmoidBackward0", "SoftmaxBackward0")


def _device_assert_findings(facts: dict[str, Any]) -> list[Finding]:
    """What a broken GPU context still lets be read: the loss's graph (which op fed BCE), and
    whether the last steps' values were lost with it."""
    out = []
    # (with logits, BCE takes any value: only the plain one's kernel checks its input)
    edges = facts.get("loss_edges") or []
    feeds_bce = [source for node, source in edges if node == "BinaryCrossEntropyBackward0"]
    if feeds_bce and feeds_bce[0] in _BOUNDED:
        out.append(
            Finding(
                f"the loss is binary_cross_entropy of {feeds_bce[0]}'s output, which stays in "
                "[0, 1] unless it is NaN",
                rule_in=("bce_nan",),
                rule_out=("bce", "labels", "embedding"),
            )
        )
    elif feeds_bce:
        out.append(
            Finding(
                f"the loss is binary_cross_entropy of {feeds_bce[0]}'s output, which no sigmoid "
                "bounds to [0, 1]",
                rule_in=("bce",),
                rule_out=("labels",),
            )
        )
    if facts.get("unread"):
        out.append(
            Finding(
                "the last steps' losses were still on the GPU when it failed, unread: whether "
                "the loss ran away before the error cannot be told"
            )
        )
    return out


def _diverged(losses: list[float], weights: list[str], largest: float) -> str | None:
    """What says the run diverged before the error: weights that are NaN or Inf or huge, a
    non-finite loss, or one that rose to over ten times the first (a NaN the error then met,
    such as BCELoss's input)."""
    if weights:
        return f"the weights are not finite ({', '.join(weights)}): the last update diverged"
    if largest > HUGE_WEIGHT:
        return f"a weight has grown to {largest:.3g}: the updates diverged"
    if len(losses) < 2:
        return None
    if not all(math.isfinite(v) for v in losses):
        return f"the loss was non-finite before the error ({len(losses)} steps recorded)"
    first, top = abs(losses[0]), max(losses)
    if first > 0 and top > 10 * first:
        return (
            f"the loss rose from {losses[0]:.4g} to {top:.4g} in {len(losses)} steps before "
            "the error: the run diverged"
        )
    return None


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        return ""
    lines = text.strip().splitlines()
    return "\n".join(lines[:5])[:2000]


def _config(module: Any) -> dict[str, Any]:
    names = _CONFIG.get(type(module).__name__, ())
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(module, name, None)
        out[name] = list(value) if isinstance(value, tuple) else value
    if names:
        out["bias"] = getattr(module, "bias", None) is not None
        groups = getattr(module, "groups", None)
        if groups is not None:
            out["groups"] = groups
    return out


def _plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None
