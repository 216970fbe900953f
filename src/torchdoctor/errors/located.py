"""An explanation made specific to the live run it came from: the module that raised, named by
its qualified name, and fixes written with its real numbers instead of a stand-in layer.

`torchdoctor explain` reads only text, so its fixes name a generic `self.fc`. When the script
crashes under torchdoctor the capture knows more (the module object, its constructor
arguments, the line of the model's code that builds it); `locate_explanation` folds that in.
Pure: plain data in, a new Explanation out.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from torchdoctor.errors.api import Explanation
from torchdoctor.errors.catalog import LOWER_LR
from torchdoctor.frames import short_site

_LR_ARG = re.compile(r"\blr\s*=\s*[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")

# The layer kinds whose constructor we can write back with a corrected number.
_BUILDERS = ("Linear", "Conv1d", "Conv2d", "Conv3d")


def locate_explanation(explanation: Explanation, place: dict[str, Any]) -> Explanation:
    """`place`: module (qualified name), module_type, target (`self.fc1`), definition
    ({file, line, code}), config (the module's constructor arguments), inputs (tensors its
    forward received); optimizer (the primary: label, type, lr, the definition of the line
    that makes it), for a learning-rate fix that names that line."""
    e = dataclasses.replace(
        explanation,
        fields=dict(explanation.fields),
        fixes=list(explanation.fixes),
        causes=list(explanation.causes),
    )
    if e.recognised and e.fixes and e.fixes[0]["title"].startswith(LOWER_LR):
        _lower_lr_at_its_line(e, place.get("optimizer") or {})
    module = place.get("module")
    if not module or not e.recognised:
        return e
    kind = place.get("module_type") or "module"
    e.fields["module"] = module
    e.fields["module_type"] = kind
    definition = place.get("definition")
    if definition is not None:
        e.fields["defined_at"] = short_site(definition.site)
    built = _rebuilt(e, place)
    where = f"{module} ({kind}"
    where += f", defined at {e.fields['defined_at']})" if "defined_at" in e.fields else ")"
    if built is not None:
        title, code, summary = built
        e.summary = summary
        keyword = f"nn.{kind}("
        e.fixes = [{"title": title, "code": code}] + [
            f for f in e.fixes if keyword not in f["code"] and "self.fc" not in f["code"]
        ]
    else:
        e.summary = f"In {where}: {e.summary}"
    return e


def _lower_lr_at_its_line(e: Explanation, optimizer: dict[str, Any]) -> None:
    """The learning-rate fix ranked first (the run diverged): written on the script's own line
    that makes the optimizer, with a tenth of its rate, in place of the catalog's stand-in
    optimizer line (its other lines, a clip or a warm-up, stay), and that line named in the
    summary."""
    made, lr = optimizer.get("definition"), optimizer.get("lr")
    if made is None or not made.code:
        return
    at = short_site(made.site)
    code = made.code
    lower = f"{lr / 10:g}" if isinstance(lr, (int, float)) and lr > 0 else None
    fixed = _LR_ARG.sub(f"lr={lower}", code, count=1) if lower else code
    lines = [f"# {at} now: {code}"]
    lines += [fixed if fixed != code else f"{code}  # lower its lr: 10x or more"]
    first = e.fixes[0]
    lines += [x for x in first["code"].splitlines() if not x.startswith("optimizer = ")]
    e.fixes = [{"title": first["title"], "code": "\n".join(lines)}, *e.fixes[1:]]
    rate = f" (lr {lr:g})" if isinstance(lr, (int, float)) else ""
    name = optimizer.get("label") or "the optimizer"
    e.summary = f"{e.summary} The learning rate{rate} is set where {name} is made, at {at}."
    e.fields["optimizer_at"] = at


def _rebuilt(e: Explanation, place: dict[str, Any]) -> tuple[str, str, str] | None:
    """(fix title, fix code, summary) for a Linear or Conv layer given the wrong input size."""
    kind = place.get("module_type")
    config = place.get("config") or {}
    target = place.get("target") or f"self.{place.get('module')}"
    module = place["module"]
    f = e.fields
    if kind == "Linear" and e.category == "shape.matmul":
        expected = config.get("in_features", f.get("in_features"))
        out = config.get("out_features", f.get("out_features"))
        got = f.get("got_features") or _last_dim(place)
        if expected is None or out is None or got is None or got == expected:
            return None
        bias = "" if config.get("bias", True) else ", bias=False"
        lines = [*_was(place), f"{target} = nn.Linear({got}, {out}{bias})"]
        lines += ["# or let PyTorch infer it at the first call:"]
        lines += [f"{target} = nn.LazyLinear({out})"]
        summary = (
            f"{module} is nn.Linear({expected}, {out}): it expects {expected} input features "
            f"and receives {got}"
            + (f" (a {f['left']} input against its {f['right']} weight)." if f.get("left") else ".")
        )
        return f"Make {module} take {got} input features", "\n".join(lines), summary
    if kind in _BUILDERS[1:] and e.category == "shape.conv_input":
        expected = config.get("in_channels", f.get("expected_channels"))
        got = f.get("got_channels")
        if expected is None or got is None or got == expected:
            return None
        if f.get("input_last_dim") == expected:
            return None  # channels-last data: permute the input, keep the layer
        args = _conv_args(config, got)
        code = "\n".join([*_was(place), f"{target} = nn.{kind}({args})"])
        summary = (
            f"{module} is an nn.{kind} with {expected} input channels and receives {got} "
            f"(input {f.get('input_shape', '?')})."
        )
        return f"Make {module} take {got} input channels (or convert the data)", code, summary
    return None


def _conv_args(config: dict[str, Any], channels: int) -> str:
    parts = [str(channels), str(config.get("out_channels", "out_channels"))]
    kernel = config.get("kernel_size")
    parts.append(f"kernel_size={_one(kernel)}")
    for name, default in (("stride", 1), ("padding", 0), ("dilation", 1), ("groups", 1)):
        value = config.get(name)
        if value is not None and _one(value) != default:
            parts.append(f"{name}={_one(value)}")
    if config.get("bias") is False:
        parts.append("bias=False")
    return ", ".join(parts)


def _one(value: Any) -> Any:
    """(5, 5) -> 5; (3, 5) stays."""
    if isinstance(value, (list, tuple)) and value and all(v == value[0] for v in value):
        return value[0]
    return tuple(value) if isinstance(value, list) else value


def _was(place: dict[str, Any]) -> list[str]:
    """The line of the model's code the fix replaces, as a comment."""
    definition = place.get("definition")
    if definition is None or not definition.code:
        return []
    return [f"# {short_site(definition.site)} now: {definition.code}"]


def _last_dim(place: dict[str, Any]) -> int | None:
    for tensor in place.get("inputs") or []:
        shape = tensor.shape
        if shape:
            return int(shape[-1])
    return None
