"""Wrapping a model for data parallelism: FSDP's flattening of parameters, DDP's bookkeeping of
which parameters are ready."""

from __future__ import annotations

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, first, rx
from torchdoctor.errors.facts import mentions


def _fsdp_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    m = rx(r"uniform dtype but got (?:torch\.)?(\w+) and (?:torch\.)?(\w+)").search(message)
    if m:
        f["dtype_a"], f["dtype_b"] = m.group(1), m.group(2)
        f["uniform"] = "dtype"
    elif rx(r"uniform `?requires_grad").search(message):
        f["uniform"] = "requires_grad"
    if rx(r"use_orig_params=False").search(message):
        f["use_orig_params"] = False
    return f


FSDP_SETUP = Entry(
    code="fsdp.setup",
    title="FSDP cannot flatten the parameters of a unit",
    meaning=(
        "FSDP flattens the parameters of each wrapped unit into one FlatParameter, which has "
        "a single dtype and a single requires_grad. A unit that mixes frozen and trainable "
        "parameters (a LoRA adapter on a frozen layer) or bf16 and fp32 ones (adapters or "
        "norms kept in float32, 4-bit storage) cannot be flattened."
    ),
    patterns=(
        r"`?FlatParameter`? requires uniform `?(?:requires_grad|dtype)",
        r"Must flatten tensors with uniform (?:requires_grad|dtype)",
        r"Must flatten tensors on the same device",
        r"FSDP only supports (?:uniform|non-uniform)",
    ),
    keys=(r"FlatParameter", r"_flat_param\.py"),
    priority=3,
    examples=(
        "ValueError: `FlatParameter` requires uniform `requires_grad`",
        "ValueError: Must flatten tensors with uniform dtype but got torch.bfloat16 and "
        "torch.float32",
    ),
    summary=(
        "An FSDP unit mixes {{dtype_a}} and {{dtype_b}} parameters; one FlatParameter holds "
        "one dtype.",
        "An FSDP unit mixes parameters that require grad with frozen ones.",
        "FSDP could not flatten a unit's parameters into one FlatParameter.",
    ),
    extract=_fsdp_fields,
    causes=(
        Cause(
            "frozen_and_trainable",
            "Frozen and trainable parameters share an FSDP unit (PEFT/LoRA adapters on a "
            "frozen base, a frozen encoder inside a wrapped block) while use_orig_params is "
            "False.",
            weight=1,
            when=lambda f: f.get("uniform") == "requires_grad" or None,
            boost=20,
        ),
        Cause(
            "mixed_dtypes",
            "Parameters of one unit have different dtypes: LoRA adapters or norms created in "
            "float32 next to bf16 weights, a checkpoint loaded in another dtype on some ranks, "
            "or QLoRA's 4-bit storage type.",
            weight=1,
            when=lambda f: f.get("uniform") == "dtype" or None,
            boost=20,
        ),
        Cause(
            "old_torch",
            "torch older than 2.0 cannot flatten non-uniform requires_grad even with "
            "use_orig_params=True.",
            weight=0.2,
        ),
    ),
    first_steps=(
        "List what each unit would hold: `{(p.dtype, p.requires_grad) for p in "
        "block.parameters()}` for the module class you wrap.",
    ),
    fixes=(
        Fix(
            "Keep the original parameters (mixed requires_grad is then allowed)",
            "model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)\n"
            "# accelerate: fsdp_use_orig_params: true",
            ("frozen_and_trainable", "old_torch"),
        ),
        Fix(
            "Give every parameter one dtype before wrapping; let MixedPrecision cast",
            "model = model.to(torch.bfloat16)  # before FSDP(...), adapters included\n"
            "# QLoRA: BitsAndBytesConfig(..., bnb_4bit_quant_storage=torch.bfloat16)\n"
            "# accelerate: fsdp_cpu_ram_efficient_loading: true "
            "(FSDP_CPU_RAM_EFFICIENT_LOADING=1)",
            ("mixed_dtypes",),
        ),
    ),
)


def _ddp_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    name = first(r"Parameter at index \d+ with name (\S+) has been marked", text)
    if name:
        f["parameter"] = name
    index = first(r"Parameter at index (\d+)", text)
    if index:
        f["parameter_index"] = int(index)
    return f


READY_TWICE = Entry(
    code="ddp.ready_twice",
    title="DDP: a parameter's gradient was ready twice in one iteration",
    meaning=(
        "DDP all-reduces each parameter's gradient once per backward pass, when autograd "
        "marks it ready. A parameter whose gradient hook fires twice breaks that: reentrant "
        "activation checkpointing (each checkpointed segment runs its own backward), a "
        "parameter shared by two parts of the model, or one used outside forward()."
    ),
    patterns=(
        r"Expected to mark a variable ready only once",
        r"has been marked as ready twice",
    ),
    keys=(r"marked (?:a variable )?ready",),
    priority=3,
    examples=(
        "RuntimeError: Expected to mark a variable ready only once. This error is caused by "
        "one of the following reasons: 1) Use of a module parameter outside the `forward` "
        "function. ... 2) Reused parameters in multiple reentrant backward passes.",
    ),
    summary=(
        "DDP saw the gradient of {{parameter}} become ready twice in one backward pass.",
        "DDP saw a parameter's gradient become ready twice in one backward pass.",
    ),
    extract=_ddp_fields,
    causes=(
        Cause(
            "reentrant_checkpoint",
            "Activation (gradient) checkpointing in its reentrant form: each checkpointed "
            "segment runs a backward of its own, so DDP sees the same parameters ready again "
            "(Hugging Face's gradient_checkpointing uses it unless told otherwise).",
            weight=2,
            when=lambda f: mentions(f, "checkpointing", "peft") or None,
            boost=5,
        ),
        Cause(
            "shared_parameter",
            "A parameter is used twice in one forward (tied weights, a module called twice) "
            "and DDP was built with find_unused_parameters=True.",
            weight=1,
        ),
        Cause(
            "outside_forward",
            "A parameter is used outside forward() (in the loss, a regulariser on "
            "model.module's weights), or two forwards share one backward.",
            weight=0.5,
        ),
    ),
    first_steps=(
        "Run with TORCH_DISTRIBUTED_DEBUG=DETAIL to get the parameter's name.",
        "Look for torch.utils.checkpoint (or gradient_checkpointing=True) and for modules "
        "called twice in forward().",
    ),
    fixes=(
        Fix(
            "Use non-reentrant checkpointing (or declare the graph static)",
            'model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": '
            "False})\n"
            "# plain PyTorch: checkpoint(block, x, use_reentrant=False)\n"
            "# or, when the graph is the same every step: DDP(model, static_graph=True)",
            ("reentrant_checkpoint",),
        ),
        Fix(
            "Declare the graph static",
            "model = DDP(model, device_ids=[local_rank], static_graph=True)",
            ("shared_parameter", "reentrant_checkpoint"),
        ),
        Fix(
            "Use parameters only inside forward()",
            "out, reg = model(x)  # compute the regulariser inside forward and return it",
            ("outside_forward",),
        ),
    ),
)

ENTRIES = (FSDP_SETUP, READY_TWICE)
