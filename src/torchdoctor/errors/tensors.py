"""Tensors that do not fit together: devices, dtypes, conversion to NumPy."""

from __future__ import annotations

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, first, rx

_INPUT_WEIGHT = r"Input type \(([^)]*)\) and (?:weight|bias) type \(([^)]*)\) should be the same"


def _input_weight_devices_differ(message: str) -> bool | None:
    m = rx(_INPUT_WEIGHT).search(message)
    if m is None:
        return None
    return ("cuda" in m.group(1).lower()) != ("cuda" in m.group(2).lower())


def _device_guard(message: str) -> bool:
    differ = _input_weight_devices_differ(message)
    return True if differ is None else differ


def _dtype_guard(message: str) -> bool:
    differ = _input_weight_devices_differ(message)
    return True if differ is None else not differ


def _device_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    m = rx(r"at least two devices, (\S+?) and (\S+?)!").search(message)
    if m:
        f["device_a"], f["device_b"] = m.group(1), m.group(2)
    m = rx(r"but got (\w+) is on (\S+?), different from other tensors on (\S+?)[ ,(]").search(
        message
    )
    if m:
        f["argument"], f["device_b"], f["device_a"] = m.group(1), m.group(2), m.group(3)
    m = rx(
        r"Expected object of device type (\w+) but got device type (\w+) for argument #\d+ "
        r"'(\w+)'"
    ).search(message)
    if m:
        f["device_a"], f["device_b"], f["argument"] = m.group(1), m.group(2), m.group(3)
    m = rx(
        r"Tensor for argument #\d+ '(\w+)' is on (\w+), but expected (?:it )?to be on (\w+)"
    ).search(message)
    if m:
        f["argument"], f["device_b"], f["device_a"] = m.group(1), m.group(2), m.group(3)
    argument = first(r"checking argument for argument (\w+)", message)
    if argument:
        f["argument"] = argument
    op = (
        first(r"in method (\w+)", message)
        or first(r"in call to (\w+)", message)
        or first(r"while checking arguments for (\w+)", message)
    )
    if op:
        f["op"] = op
    m = rx(_INPUT_WEIGHT).search(message)
    if m:
        f["input_type"], f["weight_type"] = m.group(1), m.group(2)
    return f


_INPUT_ARGS = ("mat1", "input", "target", "index", "indices")
_WEIGHT_ARGS = ("mat2", "weight", "bias")


def _cpu_side(f: Fields) -> str | None:
    """Which side is on the CPU: 'input' or 'weight' (None when the message does not say)."""
    if "input_type" in f:
        if "cuda" in f["input_type"].lower() and "cuda" not in f["weight_type"].lower():
            return "weight"
        if "cuda" not in f["input_type"].lower() and "cuda" in f["weight_type"].lower():
            return "input"
        return None
    argument, on = f.get("argument"), str(f.get("device_b", "")).lower()
    if argument is None or not on:
        return None
    arg_on_cpu = on == "cpu"
    if argument in _INPUT_ARGS:
        return "input" if arg_on_cpu else "weight"
    if argument in _WEIGHT_ARGS:
        return "weight" if arg_on_cpu else "input"
    return None


def _model_on_cpu(f: Fields) -> bool:
    return _cpu_side(f) == "weight"


def _input_on_cpu(f: Fields) -> bool:
    return _cpu_side(f) == "input"


DEVICE_MISMATCH = Entry(
    code="device.mismatch",
    title="Tensors on different devices",
    meaning=(
        "One operation received tensors on different devices (CPU and a GPU, or two GPUs). "
        "PyTorch never moves data implicitly: the model's parameters, the batch and any "
        "tensor created along the way must be on the same device."
    ),
    patterns=(
        r"Expected all tensors to be on the same device",
        r"Expected object of device type \w+ but got device type \w+",
        _INPUT_WEIGHT,
        r"is on (?:CPU|GPU|cpu|cuda:?\d*), but expected (?:it )?to be on",
        r"indices should be either on cpu or on the same device as the indexed tensor",
        r"to have the same device as tensor for argument",
        r"found at least two devices",
        r"Expected a '\w+' device type for generator",
        r"Placeholder storage has not been allocated on MPS device",
    ),
    guard=_device_guard,
    examples=(
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:0 and cpu! (when checking argument for argument mat1 in method "
        "wrapper_CUDA_addmm)",
        "RuntimeError: Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) "
        "should be the same",
        "RuntimeError: Expected object of device type cuda but got device type cpu for "
        "argument #1 'self' in call to _thnn_conv2d_forward",
    ),
    summary=(
        "{{op}} got its argument {{argument}} on {{device_b}} while other tensors are on "
        "{{device_a}}.",
        "Tensors on {{device_a}} and {{device_b}} met in {{op}}.",
        "Tensors on {{device_a}} and {{device_b}} met in one operation.",
        "The input is a {{input_type}} but the layer's weights are {{weight_type}}: they are "
        "on different devices.",
        "Tensors on different devices met in one operation.",
    ),
    extract=_device_fields,
    causes=(
        Cause(
            "mps_not_moved",
            "On a Mac, part of the computation is not on the 'mps' device: the model was moved "
            "and the batch was not (or the reverse), or a trainer left one of them on the CPU.",
            weight=0.1,
            signals=(r"Placeholder storage has not been allocated on MPS",),
            boost=20,
        ),
        Cause(
            "input_not_moved",
            "The batch (inputs or targets) was not moved to the model's device, or the result "
            "of x.to(device) was not assigned (tensors' .to() returns a new tensor; only "
            "modules move in place).",
            weight=3,
            when=_input_on_cpu,
        ),
        Cause(
            "model_not_moved",
            "The model, or part of it, is still on the CPU: model.to(device) ran before a "
            "layer was added or replaced, or a sub-model was built after the move.",
            weight=2,
            when=_model_on_cpu,
        ),
        Cause(
            "created_tensor",
            "A tensor created during forward or in the loss (torch.zeros, torch.arange, "
            "torch.tensor, a mask, position ids, class weights) is on the CPU by default.",
            weight=1.5,
            signals=(r"arange|zeros|ones|torch\.tensor|full\(|mask|pos_weight|weight=",),
            boost=2,
        ),
        Cause(
            "plain_attribute",
            "A tensor kept as a plain module attribute (self.mask = torch.ones(...)) is not "
            "moved by model.to(); register it as a buffer.",
            weight=1,
        ),
        Cause(
            "two_gpus",
            "Two GPUs are involved: a hard-coded 'cuda:0' in one place and another device in "
            "another, or layers spread over GPUs (device_map='auto').",
            weight=0.5,
            when=lambda f: "cuda" in f["device_a"] and "cuda" in f["device_b"],
        ),
        Cause(
            "generator",
            "A torch.Generator on another device than the tensor it is used for "
            "(torch.set_default_device('cuda') with a CPU DataLoader generator).",
            weight=0.2,
            signals=(r"generator",),
        ),
    ),
    first_steps=(
        "Print the devices involved: x.device, y.device and "
        "{p.device for p in model.parameters()} just before the failing line.",
        "Search the forward and the loss for tensors created without device=.",
    ),
    fixes=(
        Fix(
            "Put the model and every batch on the mps device",
            'device = torch.device("mps")\nmodel.to(device)\nx = x.to(device)\n'
            "# Hugging Face Trainer: TrainingArguments(..., use_mps_device=True) on old versions",
            ("mps_not_moved",),
        ),
        Fix(
            "Move the batch, and assign the result",
            "x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)",
            ("input_not_moved",),
        ),
        Fix(
            "Move the model after it is complete",
            "model = build_model()\nmodel.fc = nn.Linear(512, num_classes)\nmodel.to(device)",
            ("model_not_moved",),
        ),
        Fix(
            "Keep everything on one GPU, or follow the device map",
            "CUDA_VISIBLE_DEVICES=0 python infer.py   # one GPU: nothing can land on another\n"
            "# split on purpose (device_map='auto'): inputs go to the first layer's device\n"
            "inputs = {k: v.to(model.device) for k, v in inputs.items()}",
            ("two_gpus",),
        ),
        Fix(
            "Create tensors on the device of the data",
            "pos = torch.arange(seq_len, device=x.device)\n"
            "mask = torch.ones_like(x, dtype=torch.bool)",
            ("created_tensor", "two_gpus"),
        ),
        Fix(
            "Buffers move with the module",
            'self.register_buffer("mask", torch.tril(torch.ones(n, n)), persistent=False)',
            ("plain_attribute",),
        ),
    ),
)


def _dtype_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    for pattern, a, b in (
        (r"expected scalar type (\w+) but found (\w+)", "expected", "found"),
        (r"Found dtype (\w+) but expected (\w+)", "found", "expected"),
        (r"expected target dtype to be (\w+(?: or \w+)?), but got (\w+)", "expected", "found"),
        (r"must have the same dtype, but got (\w+) and (\w+)", "found", "expected"),
        (r"to have the same dtype, but got: ?([\w:]+) ?!= ?([\w:]+)", "found", "expected"),
        (r"Expected object of scalar type (\w+) but got scalar type (\w+)", "expected", "found"),
        (r"result type (\w+) can't be cast to the desired output type (\w+)", "found", "expected"),
        (
            r"one of the following scalar types: ([\w, ]+?); but got ([\w.]+) instead",
            "expected",
            "found",
        ),
        (r"Input type \(([^)]*)\) and (?:weight|bias) type \(([^)]*)\)", "found", "expected"),
    ):
        m = rx(pattern).search(message)
        if m:
            f[a], f[b] = m.group(1), m.group(2)
            break
    m = rx(r"\"(\w+)\" not implemented for '(\w+)'").search(message)
    if m:
        f["op"], f["found"] = m.group(1), m.group(2)
    return f


def _mentions(f: Fields, *words: str) -> bool:
    values = f"{f.get('found', '')} {f.get('expected', '')}".lower()
    return any(w in values for w in words)


DTYPE_MISMATCH = Entry(
    code="dtype.mismatch",
    title="Tensors of different or unsupported dtypes",
    meaning=(
        "An operation received a dtype it does not accept: float64 data meeting float32 "
        "weights, class targets that are not int64, half precision outside autocast, or a "
        "dtype the operation has no kernel for. PyTorch promotes types in arithmetic but not "
        "in matrix products, convolutions and losses."
    ),
    patterns=(
        r"expected scalar type \w+ but found \w+",
        r"(?:to have|must have) the same dtype",
        _INPUT_WEIGHT,
        r"Found dtype \w+ but expected \w+",
        r"expected target dtype to be",
        r"\"\w+\" not implemented for '\w+'",
        r"result type \w+ can't be cast to the desired output type",
        r"Expected object of scalar type \w+ but got scalar type",
        r"to have one of the following scalar types",
        r"value cannot be converted to type \S+ without overflow",
        r"Got unsupported ScalarType \w+",
        r"can't convert np\.ndarray of type numpy\.object_",
    ),
    guard=_dtype_guard,
    examples=(
        "RuntimeError: expected scalar type Float but found Double",
        "RuntimeError: mat1 and mat2 must have the same dtype, but got Double and Float",
        "RuntimeError: expected target dtype to be Long or Byte, but got Float",
        "RuntimeError: \"nll_loss_forward_reduce_cuda_kernel_2d_index\" not implemented for 'Int'",
    ),
    summary=(
        "{{op}} has no kernel for {{found}}.",
        "Got {{found}} where {{expected}} was expected.",
        "An operation received tensors of a dtype it does not accept.",
    ),
    extract=_dtype_fields,
    causes=(
        Cause(
            "float64",
            "float64 data meets float32 weights: NumPy arrays default to float64 and "
            "torch.from_numpy / torch.tensor keep it.",
            weight=1.5,
            when=lambda f: _mentions(f, "double", "float64"),
        ),
        Cause(
            "targets",
            "Class targets are not int64: cross_entropy and nll_loss want Long class indices "
            "(or float class probabilities of the same shape as the input).",
            weight=1.5,
            signals=(r"target|nll_loss|cross_entropy",),
            when=lambda f: _mentions(f, "long") and not _mentions(f, "double", "half"),
        ),
        Cause(
            "two_half_dtypes",
            "float16 and bfloat16 meet: one part (a component loaded with its own torch_dtype, "
            "an adapter, the inputs) is in float16 and another in bfloat16, or autocast runs "
            "in one while the weights are stored in the other.",
            weight=0,
            when=lambda f: _mentions(f, "half", "float16") and _mentions(f, "bfloat16"),
            boost=12,
            only_when=True,
        ),
        Cause(
            "half",
            "Half or bfloat16 tensors meet float32 ones outside autocast: a manual .half() on "
            "the model or the inputs, or an op outside the autocast region.",
            weight=1,
            when=lambda f: _mentions(f, "half", "bfloat16", "c10::half"),
        ),
        Cause(
            "no_kernel",
            "The operation has no kernel for this dtype on this device (half precision on the "
            "CPU in older releases, integer inputs to a floating-point op).",
            weight=1,
            when=lambda f: "op" in f,
        ),
        Cause(
            "fp16_overflow",
            "A constant too large for float16: masked_fill(mask, -1e9) or float('-inf') "
            "arithmetic in half precision.",
            weight=0.5,
            signals=(r"without overflow",),
        ),
        Cause(
            "float_indices",
            "Indices given as floats: embeddings, gather and indexing want int64 indices.",
            weight=0.5,
            signals=(r"'indices'|embedding|index",),
        ),
        Cause(
            "numpy_object",
            "A NumPy array of Python objects (ragged lists, strings, None values) cannot "
            "become a tensor.",
            weight=0.3,
            signals=(r"numpy\.object_",),
        ),
        Cause(
            "bf16_numpy",
            "NumPy has no bfloat16: convert with .float() before .numpy().",
            weight=0.3,
            signals=(r"unsupported ScalarType BFloat16",),
        ),
    ),
    first_steps=(
        "Print x.dtype for the inputs, the targets and next(model.parameters()).dtype.",
        "Fix dtypes where data enters (the Dataset or the collate function), not deep inside "
        "the model.",
    ),
    fixes=(
        Fix(
            "Convert data to float32 once, at the boundary",
            "x = torch.from_numpy(array).float()  # float64 -> float32",
            ("float64", "numpy_object"),
        ),
        Fix(
            "Class indices as int64",
            "loss = F.cross_entropy(logits, targets.long())",
            ("targets", "float_indices"),
        ),
        Fix(
            "One half-precision dtype throughout",
            "model.to(torch.bfloat16)            # every component, adapters included\n"
            "x = x.to(torch.bfloat16)\n"
            "# or load each part with the same torch_dtype=torch.bfloat16",
            ("two_half_dtypes",),
        ),
        Fix(
            "Let autocast choose per-op precision, or give the input the weights' dtype",
            'with torch.autocast("cuda", dtype=torch.bfloat16):\n    out = model(x)\n'
            "x = x.to(next(model.parameters()).dtype)  # without autocast",
            ("half", "no_kernel"),
        ),
        Fix(
            "Mask with the dtype's own limit",
            "scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)",
            ("fp16_overflow",),
        ),
        Fix("bfloat16 to NumPy", "array = t.float().cpu().numpy()", ("bf16_numpy",)),
    ),
)

NUMPY_CONVERSION = Entry(
    code="tensor.numpy_conversion",
    title="Cannot convert this tensor to NumPy",
    meaning=(
        "Tensor.numpy() shares memory with a CPU tensor and has no autograd. It refuses "
        "tensors that require grad and tensors on a GPU."
    ),
    patterns=(
        r"Can't call `?numpy\(\)`? on (?:Tensor|Variable) that requires grad",
        r"can't convert \S+ device type tensor to numpy",
    ),
    examples=(
        "RuntimeError: Can't call numpy() on Tensor that requires grad. Use "
        "tensor.detach().numpy() instead.",
        "TypeError: can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy "
        "the tensor to host memory first.",
    ),
    summary=("A tensor that requires grad or lives on a GPU was converted to NumPy.",),
    causes=(
        Cause(
            "requires_grad",
            "The tensor is part of the autograd graph (a model output, a parameter).",
            weight=1,
            signals=(r"requires grad",),
        ),
        Cause(
            "gpu",
            "The tensor lives on a GPU; NumPy arrays live in host memory.",
            weight=1,
            signals=(r"device type tensor",),
        ),
    ),
    first_steps=("Convert at the edge: detach, move to the CPU, then convert.",),
    fixes=(
        Fix(
            "Detach, copy to the host, convert",
            "array = out.detach().cpu().numpy()\nvalue = loss.item()  # for a scalar",
            ("requires_grad", "gpu"),
        ),
    ),
)

ENTRIES = (DEVICE_MISMATCH, DTYPE_MISMATCH, NUMPY_CONVERSION)
