"""Numerical failures: NaN/Inf found by anomaly detection, by checks on the loss or gradients,
and loss inputs outside their domain."""

from __future__ import annotations

from torchdoctor.errors.catalog import LOWER_LR, Cause, Entry, Fields, Fix, first, rx
from torchdoctor.errors.extract import FRAME, LIBRARY

_NAN_STEPS = (
    "Find the first place a non-finite value appears: assert torch.isfinite(loss) after the "
    "loss and on the gradients after backward; forward hooks that check every layer's "
    "output name the first layer that goes bad (`torchdoctor run` records it as a `nan` "
    "diagnosis).",
    "Check the inputs of that step: torch.isfinite(x).all() on the batch rules out bad data.",
)


def _forward_frame(text: str) -> tuple[str, str] | None:
    """The innermost user frame of the forward trace printed by anomaly mode."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "Traceback of forward call that caused the error" not in line:
            continue
        best: tuple[str, str] | None = None
        for j in range(i + 1, min(len(lines), i + 400)):
            m = FRAME.match(lines[j])
            if m:
                if not LIBRARY.search(m.group("file")):
                    code = lines[j + 1].strip() if j + 1 < len(lines) else ""
                    best = (f"{m.group('file')}:{m.group('line')}", code)
            elif lines[j].strip() and not lines[j][:1].isspace():
                break
        return best
    return None


def _anomaly_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    m = rx(r"Function '(\w+)' returned (nan|inf) values in its (\d+)\w* output").search(message)
    if m:
        f["function"], f["value"], f["output"] = m.group(1), m.group(2).lower(), int(m.group(3))
        f["op"] = rx(r"Backward\d*$").sub("", m.group(1))
    forward = _forward_frame(text)
    if forward is not None:
        f["forward_location"], f["forward_code"] = forward
    return f


def _op_in(f: Fields, *names: str) -> bool:
    return any(f["op"].startswith(n) for n in names)


ANOMALY = Entry(
    code="nan.anomaly",
    title="Anomaly detection found NaN in backward",
    meaning=(
        "With anomaly detection on, autograd checks every backward function's output and "
        "stops at the first that produces NaN (or Inf). The function named is the backward of "
        "the operation at fault; the warning printed just before holds the forward line that "
        "created it."
    ),
    patterns=(
        r"Function '\w+' returned (?:nan|inf) values in its \d+\w* output",
        r"returned nan values in its",
    ),
    examples=(
        "RuntimeError: Function 'LogBackward0' returned nan values in its 0th output.",
        "RuntimeError: Function 'DivBackward0' returned nan values in its 1th output.",
        "RuntimeError: Function 'SqrtBackward' returned nan values in its 0th output.",
    ),
    summary=(
        "The backward of {{op}} produced {{value}}; the forward operation is at "
        "{{forward_location}}: `{{forward_code}}`.",
        "The backward of {{op}} ({{function}}) produced {{value}} values in its output {{output}}.",
        "A backward function produced NaN values.",
    ),
    extract=_anomaly_fields,
    causes=(
        Cause(
            "log_zero",
            "log of zero or of a negative number (probabilities that underflow to 0).",
            weight=0,
            when=lambda f: _op_in(f, "Log", "Xlogy"),
            boost=12,
            only_when=True,
        ),
        Cause(
            "div_zero",
            "Division by zero: a sum or norm that is 0, an empty mask, a zero variance.",
            weight=0,
            when=lambda f: _op_in(f, "Div", "Reciprocal", "Rsqrt"),
            boost=12,
            only_when=True,
        ),
        Cause(
            "sqrt_zero",
            "sqrt, pow with an exponent below 1, or a norm evaluated at 0: the derivative "
            "there is infinite, and infinity times zero is NaN.",
            weight=0,
            when=lambda f: _op_in(f, "Sqrt", "Pow", "Norm", "LinalgVectorNorm", "Cdist"),
            boost=12,
            only_when=True,
        ),
        Cause(
            "overflow",
            "Overflow in exp, softmax or a matrix product, typically in float16 with large "
            "activations or logits.",
            weight=0.5,
            when=lambda f: _op_in(f, "Exp", "Softmax", "LogSoftmax", "Mm", "Addmm", "Bmm", "Mul"),
            boost=12,
            only_when=True,
        ),
        Cause(
            "domain",
            "An operation at the edge of its domain: acos/asin at +-1, atanh at +-1.",
            weight=0,
            when=lambda f: _op_in(f, "Acos", "Asin", "Atanh"),
            boost=12,
            only_when=True,
        ),
        Cause(
            "bad_input",
            "NaN already in the inputs or the weights (bad data, a previous divergent step).",
            weight=1,
        ),
        Cause(
            "learning_rate",
            "A learning rate too high, or no warm-up, pushed weights to extreme values.",
            weight=0.8,
        ),
    ),
    first_steps=(
        "Go to the forward line the anomaly warning prints (just above the error) and guard "
        "the operation there.",
        "Turn anomaly detection off again once the operation is found: it slows every step "
        "many times over.",
        *_NAN_STEPS,
    ),
    fixes=(
        Fix(
            "Log-probabilities from logits, not log of probabilities",
            "log_probs = F.log_softmax(logits, dim=-1)\n"
            "loss = F.cross_entropy(logits, target)  # or directly",
            ("log_zero", "overflow"),
        ),
        Fix(
            "An epsilon or a clamp in the denominator",
            "x = x / (x.norm(dim=-1, keepdim=True) + 1e-8)\n"
            "x = x / x.sum(dim=-1, keepdim=True).clamp_min(1e-8)",
            ("div_zero",),
        ),
        Fix(
            "Keep sqrt away from zero",
            "dist = torch.sqrt(sq_dist + 1e-12)",
            ("sqrt_zero",),
        ),
        Fix(
            "Clamp into the domain",
            "angle = torch.acos(cos.clamp(-1 + 1e-7, 1 - 1e-7))",
            ("domain",),
        ),
        Fix(
            "bfloat16 instead of float16, and clipped gradients",
            'with torch.autocast("cuda", dtype=torch.bfloat16):\n    loss = model(x)\n'
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)",
            ("overflow", "learning_rate"),
        ),
        Fix(
            "Check the data",
            "assert torch.isfinite(x).all(), 'non-finite input batch'",
            ("bad_input",),
        ),
        Fix(
            f"{LOWER_LR} and warm up",
            "scheduler = torch.optim.lr_scheduler.LambdaLR(\n"
            "    optimizer, lambda step: min(1.0, (step + 1) / 1000))",
            ("learning_rate",),
        ),
    ),
)

_NAN_CAUSES = (
    Cause(
        "learning_rate",
        "A learning rate too high, or no warm-up, drives the weights to overflow.",
        weight=2,
    ),
    Cause(
        "unstable_op",
        "A numerically unsafe operation: log of 0, division by a zero sum or norm, sqrt at 0, "
        "softmax over huge logits.",
        weight=1.5,
    ),
    Cause(
        "fp16",
        "float16 overflow (values above 65504) under mixed precision.",
        weight=1,
        signals=(r"fp16|float16|half|GradScaler|autocast|amp",),
    ),
    Cause(
        "no_clipping",
        "No gradient clipping: one unusual batch makes the gradients explode.",
        weight=1,
    ),
    Cause(
        "bad_data",
        "Non-finite or extreme values in the data (a corrupt sample, a division in preprocessing).",
        weight=0.8,
    ),
)

_NAN_FIXES = (
    Fix(
        f"{LOWER_LR} and warm it up",
        "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # e.g. a tenth of now\n"
        "scheduler = torch.optim.lr_scheduler.LambdaLR(\n"
        "    optimizer, lambda step: min(1.0, (step + 1) / 1000))",
        ("learning_rate",),
    ),
    Fix(
        "Clip gradients",
        "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)",
        ("no_clipping", "learning_rate"),
    ),
    Fix(
        "Numerically stable forms",
        "F.cross_entropy(logits, y)                     # not -log(softmax(...))\n"
        "x / (x.norm(dim=-1, keepdim=True) + 1e-8)    # not x / x.norm(...)",
        ("unstable_op",),
    ),
    Fix(
        "Prefer bfloat16 to float16",
        'with torch.autocast("cuda", dtype=torch.bfloat16):\n    loss = criterion(model(x), y)',
        ("fp16",),
    ),
    Fix(
        "Find the first bad layer or batch",
        "with torch.autograd.detect_anomaly():  # one step only: it is slow\n"
        "    loss = criterion(model(x), y)\n    loss.backward()",
        ("unstable_op", "bad_data"),
    ),
)


def _loss_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    step = first(r"\b(?:step|iter(?:ation)?|it)\s*[=:#]?\s*(\d+)", message)
    if step is not None:
        f["step"] = int(step)
    layer = first(r"Non-finite values in `([^`]+)`", message)
    if layer:
        f["layer"] = layer
    return f


NAN_LOSS = Entry(
    code="nan.loss",
    title="Loss or activations became NaN/Inf",
    meaning=(
        "A check in the training code (or a library) found a non-finite loss or activation. "
        "Once a NaN appears it spreads: NaN loss, NaN gradients, NaN weights, and every later "
        "step is NaN too."
    ),
    patterns=(
        r"\bloss (?:is|became|was) (?:nan|inf|infinite|non-finite)",
        r"Loss became infinite or NaN",
        r"non-finite loss",
        r"Non-finite values in `",
        r"\bloss\b\s*[=:]?\s*(?:nan|-?inf)\b",
        r"NaN or Inf found in input tensor",
        r"\bnan loss\b",
    ),
    examples=(
        "FloatingPointError: Loss became infinite or NaN at iteration=1234!",
        "RuntimeError: Loss is nan, stopping training",
        "RuntimeError: Non-finite values in `encoder.layers.5.attn`: 12 entries",
        "step 1200 | loss nan | lr 3.0e-04",
    ),
    summary=(
        "The first non-finite output came from layer {{layer}}.",
        "The loss became non-finite at step {{step}}.",
        "The loss became non-finite.",
    ),
    extract=_loss_fields,
    causes=_NAN_CAUSES,
    first_steps=_NAN_STEPS,
    fixes=_NAN_FIXES,
)

GRAD_NORM = Entry(
    code="nan.grad_norm",
    title="Non-finite gradient norm",
    meaning=(
        "clip_grad_norm_(..., error_if_nonfinite=True) found NaN or Inf in the gradients. "
        "With float16 and a GradScaler, occasional Inf gradients are expected (the scaler "
        "skips those steps), but only if the gradients are unscaled before clipping."
    ),
    patterns=(
        r"total norm of order [\d.]+ for gradients from `parameters` is non-finite",
        r"gradients? (?:is|are|became) (?:nan|inf|non-finite)",
    ),
    examples=(
        "RuntimeError: The total norm of order 2.0 for gradients from `parameters` is "
        "non-finite, so it cannot be clipped. To disable this error and scale the gradients by "
        "the non-finite norm anyway, set `error_if_nonfinite=False`",
    ),
    summary=("The gradients contain NaN or Inf, so their norm is not finite.",),
    causes=(
        Cause(
            "amp",
            "Mixed precision: gradients are clipped while still scaled (no "
            "scaler.unscale_(optimizer) before clipping), or the float16 loss scale "
            "overflowed, which GradScaler handles by skipping the step.",
            weight=1,
            signals=(r"GradScaler|scaler|autocast|amp|fp16|float16",),
        ),
        *_NAN_CAUSES,
    ),
    first_steps=(
        "Print which parameters have non-finite gradients: "
        "[n for n, p in model.named_parameters() if p.grad is not None and not "
        "torch.isfinite(p.grad).all()].",
        *_NAN_STEPS,
    ),
    fixes=(
        Fix(
            "Unscale before clipping under AMP",
            "scaler.scale(loss).backward()\nscaler.unscale_(optimizer)\n"
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n"
            "scaler.step(optimizer)\nscaler.update()",
            ("amp",),
        ),
        *_NAN_FIXES,
    ),
)

BCE_RANGE = Entry(
    code="loss.bce_range",
    title="BCELoss input outside [0, 1]",
    meaning=(
        "binary_cross_entropy (nn.BCELoss) takes probabilities. Values outside [0, 1], or NaN, "
        "mean it received logits or a broken prediction."
    ),
    patterns=(
        r"all elements of (?:input|target) should be between 0 and 1",
        r"input_val >= zero && input_val <= one",
        r"Assertion `x >= 0\. && x <= 1\.' failed",
    ),
    priority=3,
    examples=(
        "RuntimeError: all elements of input should be between 0 and 1",
        "Loss.cu:92: operator(): block: [0,0,0], thread: [0,0,0] Assertion `input_val >= zero "
        "&& input_val <= one` failed.",
    ),
    summary=("binary_cross_entropy received values outside [0, 1].",),
    causes=(
        Cause(
            "logits",
            "The model outputs logits (no sigmoid) and they go to BCELoss.",
            weight=2,
        ),
        Cause(
            "nan",
            "The predictions contain NaN (a diverging run), which is outside [0, 1] too.",
            weight=1,
        ),
    ),
    first_steps=("Print pred.min(), pred.max() and torch.isnan(pred).any() before the loss.",),
    fixes=(
        Fix(
            "Give logits to BCEWithLogitsLoss",
            "criterion = nn.BCEWithLogitsLoss()  # sigmoid and BCE together, stable\n"
            "loss = criterion(logits, target.float())",
            ("logits",),
        ),
        Fix(
            f"{LOWER_LR}: the run diverged and its NaN reached the loss",
            "optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # 10x lower or more\n"
            "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # before optimizer.step()",
            ("nan",),
        ),
    ),
)


def _unscale_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    if rx(r"peft|lora|LoraConfig").search(text):
        f["adapters"] = "peft"
    return f


UNSCALE_FP16 = Entry(
    code="amp.unscale_fp16",
    title="GradScaler met float16 gradients (parameters stored in float16)",
    meaning=(
        "Mixed precision keeps the trainable parameters (and so their gradients) in float32 "
        "and lets autocast run the operations in float16; GradScaler then unscales float32 "
        "gradients. It refuses float16 gradients, because their updates would be lost to "
        "rounding: some trainable parameters are float16 themselves."
    ),
    patterns=(
        r"Attempting to unscale FP16 gradients",
        r"unscale_ called on FP16 gradients",
    ),
    keys=(r"unscale\w* .*FP16",),
    priority=3,
    examples=("ValueError: Attempting to unscale FP16 gradients.",),
    summary=("Trainable parameters are stored in float16; GradScaler needs them in float32.",),
    extract=_unscale_fields,
    causes=(
        Cause(
            "half_model",
            "The model was loaded or cast to float16 (torch_dtype=torch.float16, .half(), an "
            "fp16 checkpoint) and then trained with fp16 mixed precision.",
            weight=2,
        ),
        Cause(
            "half_adapters",
            "LoRA/PEFT adapters were created in float16 on a float16 base model; only they "
            "are trained, and they must be float32.",
            weight=1.5,
            when=lambda f: f.get("adapters") == "peft" or None,
            boost=2,
        ),
        Cause(
            "library_version",
            "A library version that casts adapters or the model differently (peft, "
            "transformers, accelerate newer than the training script expects).",
            evidence="The project pins {{pinned}} but {{installed}} is installed: a library "
            "version that casts adapters or the model differently than the script expects.",
            when=lambda f: "pinned" in f or None,
            weight=0.5,
            signals=(r"peft|transformers/trainer\.py",),
        ),
    ),
    first_steps=(
        "List the trainable parameters' dtypes: {p.dtype for p in model.parameters() if "
        "p.requires_grad}.",
    ),
    fixes=(
        Fix(
            "Keep the trainable parameters in float32 (autocast still runs in float16)",
            "for p in model.parameters():\n"
            "    if p.requires_grad:\n"
            "        p.data = p.data.float()\n"
            "# or load the model in float32: from_pretrained(..., torch_dtype=torch.float32)",
            ("half_model", "half_adapters"),
        ),
        Fix(
            "Or train in bfloat16 without a GradScaler",
            'with torch.autocast("cuda", dtype=torch.bfloat16):\n'
            "    loss = model(**batch).loss\nloss.backward()  # no scaler needed for bf16",
            ("half_model",),
        ),
        Fix(
            "Use the library versions the training script was written for",
            "pip install peft==0.3.0  # the version its requirements name",
            ("library_version",),
        ),
    ),
)

ENTRIES = (ANOMALY, NAN_LOSS, GRAD_NORM, BCE_RANGE, UNSCALE_FP16)
