"""Autograd errors: in-place changes, second backward passes, missing graphs."""

from __future__ import annotations

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, first, rx

_ANOMALY_STEP = (
    "Turn on anomaly detection for one failing step (with "
    "torch.autograd.detect_anomaly(): ...): the error then also prints the forward line that "
    "created the tensor involved. Turn it off again, it slows every step many times over."
)

LEAF_INPLACE = Entry(
    code="autograd.leaf_inplace",
    title="In-place change of a leaf tensor that requires grad",
    meaning=(
        "A leaf tensor with requires_grad=True (a parameter, or a tensor created with "
        "requires_grad=True) was modified in place while autograd was recording. Autograd "
        "would have to differentiate through the change to its own input, which it refuses. "
        "Updates of parameters belong inside torch.no_grad(), as optimizers do."
    ),
    patterns=(
        r"a leaf Variable that requires grad (?:is being|has been) used in an in-place operation",
        r"a view of a leaf Variable that requires grad is being used in an in-place operation",
        r"leaf variable has been moved into the graph interior",
    ),
    examples=(
        "RuntimeError: a leaf Variable that requires grad is being used in an in-place operation.",
        "RuntimeError: a leaf Variable that requires grad has been used in an in-place operation.",
        "RuntimeError: a view of a leaf Variable that requires grad is being used in an "
        "in-place operation.",
    ),
    summary=(
        "A tensor with requires_grad=True was changed in place at {{location}}: `{{code_line}}`.",
        "A parameter or other leaf tensor with requires_grad=True was changed in place.",
    ),
    causes=(
        Cause(
            "manual_update",
            "Weights are updated by hand (w -= lr * w.grad) outside torch.no_grad().",
            weight=2,
            signals=(r"(?:-=|\+=|\*=|/=)[^\n]*grad|\.grad\b",),
        ),
        Cause(
            "init",
            "Weights are initialised or edited in place after creation (w.fill_(), "
            "w.normal_(), w[0] = ..., w.copy_()) outside torch.no_grad().",
            weight=1.5,
            signals=(r"fill_|normal_|uniform_|zero_|copy_|\]\s*=[^=]",),
        ),
        Cause(
            "inplace_op",
            "An in-place operation (x += ..., relu_(), clamp_()) on an input tensor created "
            "with requires_grad=True.",
            weight=1,
        ),
    ),
    first_steps=(
        "Look at the line in the traceback: the tensor changed in place there is a parameter "
        "or was created with requires_grad=True.",
    ),
    fixes=(
        Fix(
            "Change the leaf under torch.no_grad(), or use the out-of-place form",
            "with torch.no_grad():          # a change autograd must not record (an update)\n"
            "    for p in model.parameters():\n"
            "        p -= lr * p.grad\n"
            "x = x + 1                      # out-of-place: autograd records a new tensor",
            ("manual_update", "inplace_op"),
        ),
        Fix(
            "Initialise with nn.init (it runs under no_grad)",
            "nn.init.normal_(layer.weight, std=0.02)\n"
            "with torch.no_grad():\n    layer.weight[0] = 0.0",
            ("init",),
        ),
        Fix(
            "Use the out-of-place form",
            "x = x + 1  # not x += 1\nx = torch.relu(x)",
            ("inplace_op",),
        ),
    ),
)


def _version_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    m = rx(r"\[(torch\.[\w.]+Tensor) \[([\d, ]*)\]\]").search(message)
    if m:
        f["tensor_type"], f["tensor_shape"] = m.group(1), m.group(2)
    m = rx(r"which is output (\d+) of (\w+)").search(message)
    if m:
        f["op_output"], f["op"] = int(m.group(1)), m.group(2)
    m = rx(r"is at version (\d+); expected version (\d+)").search(message)
    if m:
        f["version"], f["expected_version"] = int(m.group(1)), int(m.group(2))
    view = first(r"Output \d+ of (\w+) is a view and is being modified inplace", message)
    if view:
        f["view_op"] = view
    failing = first(r"Error detected in (\w+)\.", text)
    if failing:
        f["failing_backward"] = failing
    return f


INPLACE_MODIFIED = Entry(
    code="autograd.inplace_modified",
    title="A tensor needed for backward was modified in place",
    meaning=(
        "Autograd saved a tensor during the forward pass because the backward of some "
        "operation needs it, and later code overwrote that tensor in place. Every tensor "
        "carries a version counter that in-place operations bump; backward found the saved "
        "tensor at a newer version than the one it saved."
    ),
    patterns=(
        r"one of the variables needed for gradient computation has been modified by an "
        r"inplace operation",
        r"is a view and is being modified inplace",
        r"modified by an inplace operation",
    ),
    examples=(
        "RuntimeError: one of the variables needed for gradient computation has been modified "
        "by an inplace operation: [torch.cuda.FloatTensor [64, 128]], which is output 0 of "
        "ReluBackward0, is at version 2; expected version 1 instead.",
        "RuntimeError: Output 0 of SplitBackward0 is a view and is being modified inplace. This "
        "view is the output of a function that returns multiple views.",
    ),
    summary=(
        "A [{{tensor_shape}}] tensor (output {{op_output}} of {{op}}) was changed in place "
        "after autograd saved it: it is at version {{version}}, backward expected "
        "{{expected_version}}.",
        "A view created by {{view_op}} was modified in place.",
        "A tensor saved for backward was changed in place before backward ran.",
    ),
    extract=_version_fields,
    causes=(
        Cause(
            "relu_inplace",
            "An in-place activation (nn.ReLU(inplace=True), F.relu_, x.relu_()) overwrote a "
            "tensor that the previous operation saved for its backward.",
            weight=1,
            when=lambda f: any(k in f.get("op", "") for k in ("Relu", "Threshold", "LeakyRelu")),
            signals=(r"inplace=True|relu_\(",),
        ),
        Cause(
            "augmented",
            "An augmented assignment (x += y, x *= mask, x[idx] = v) changed a tensor that "
            "backward still needs, typically in a residual connection or a masking step.",
            weight=2,
        ),
        Cause(
            "own_output",
            "The output of an operation whose backward reuses its own output (sigmoid, tanh, "
            "exp, softmax) was changed in place afterwards.",
            weight=1,
            when=lambda f: any(k in f.get("op", "") for k in ("Sigmoid", "Tanh", "Exp", "Softmax")),
        ),
        Cause(
            "optimizer_between",
            "optimizer.step(), which updates parameters in place, ran between the forward and "
            "a backward that still needs the old weights: two losses from one forward with a "
            "step in between, or a GAN's generator and discriminator updated in the wrong "
            "order.",
            weight=1,
            when=lambda f: (
                any(k in f.get("op", "") for k in ("TBackward", "AsStrided", "Transpose"))
                or (f.get("op") in ("T", "t"))
            ),
            signals=(r"optimizer\.step\(\)[\s\S]*backward",),
            boost=12,
        ),
        Cause(
            "multi_view",
            "A view from split, chunk or unbind was modified in place.",
            weight=0.5,
            when=lambda f: "view_op" in f,
            boost=12,
            only_when=True,
        ),
    ),
    first_steps=(
        _ANOMALY_STEP,
        "Search the forward for in-place operations on the tensor named in the message: "
        "+=, *=, indexing assignments, methods ending in an underscore, inplace=True.",
    ),
    fixes=(
        Fix(
            "Use out-of-place operations, or clone before the change",
            "x = x + residual                    # not x += residual\n"
            "self.act = nn.ReLU(inplace=False)   # not nn.ReLU(inplace=True)\n"
            "y = y.clone()                       # when it must change in place\n"
            "y[mask] = 0",
            ("augmented", "relu_inplace", "own_output"),
        ),
        Fix(
            "Clone before changing in place",
            "y = torch.sigmoid(x).clone()\ny[mask] = 0",
            ("own_output", "multi_view", "augmented"),
        ),
        Fix(
            "All backward passes before the optimizer steps",
            "loss = loss_a + loss_b\nloss.backward()\noptimizer.step()\n"
            "# GAN: D on fake.detach(), step D; then G's loss, backward, step G",
            ("optimizer_between",),
        ),
    ),
)

BACKWARD_TWICE = Entry(
    code="autograd.backward_twice",
    title="Backward through the graph a second time",
    meaning=(
        "backward() frees the intermediate tensors saved by the forward pass once it has used "
        "them. A second backward through any part of the same graph finds them gone. Either "
        "it was meant (then pass retain_graph=True to the first backward) or, far more often, "
        "a tensor from an earlier step is still attached to the graph."
    ),
    patterns=(
        r"Trying to backward through the graph a second time",
        r"saved (?:intermediate values|tensors) .{0,80}(?:already been freed|after they have "
        r"already been freed)",
        r"buffers have already been freed",
    ),
    examples=(
        "RuntimeError: Trying to backward through the graph a second time (or directly access "
        "saved tensors after they have already been freed). Saved intermediate values of the "
        "graph are freed when you call .backward() or autograd.grad().",
        "RuntimeError: Trying to backward through the graph a second time, but the saved "
        "intermediate results have already been freed. Specify retain_graph=True when calling "
        "backward the first time.",
    ),
    summary=(
        "A second backward went through part of a graph whose saved tensors were already "
        "freed, at {{location}}.",
        "A second backward went through part of a graph whose saved tensors were already freed.",
    ),
    causes=(
        Cause(
            "state_carried",
            "A tensor from the previous iteration (an RNN hidden state, a running statistic, a "
            "cached embedding) takes part in this step's graph; detach it at the start of "
            "each step.",
            weight=2,
            signals=(r"hidden|\bhx\b|\bh\b|state|memory|cache",),
            boost=2,
        ),
        Cause(
            "two_backwards",
            "Two losses share part of the graph and each calls backward().",
            weight=1.5,
            signals=(r"loss\w*\.backward\([^\n]*\n[\s\S]*loss\w*\.backward\(",),
        ),
        Cause(
            "outside_loop",
            "A tensor computed once before the loop (a normalised weight, a precomputed "
            "feature that requires grad) is used in every step's graph.",
            weight=1,
        ),
        Cause(
            "stale_reference",
            "A stale reference to an old graph held by a hook closure or a list of outputs.",
            weight=0.5,
        ),
    ),
    first_steps=(
        "Find which tensor links this step's graph to an earlier one: hidden states, values "
        "kept across iterations, tensors computed outside the loop.",
        "Decide whether the second backward is intended before reaching for "
        "retain_graph=True: used by mistake it hides a growing graph and a memory leak.",
    ),
    fixes=(
        Fix(
            "Cut the graph between steps (retain it only for an intended second backward)",
            "hidden = hidden.detach()  # at the start of each step (truncated BPTT)\n"
            "# two backward passes through one graph on purpose:\n"
            "loss_a.backward(retain_graph=True)\nloss_b.backward()",
            ("state_carried", "stale_reference"),
        ),
        Fix(
            "One backward for several losses",
            "(loss_a + loss_b).backward()\n# or, if needed: loss_a.backward(retain_graph=True)",
            ("two_backwards",),
        ),
        Fix(
            "Recompute per step",
            "for x, y in loader:\n"
            "    w = normalize(raw_w)  # inside the loop: a fresh graph each step\n"
            "    ...",
            ("outside_loop",),
        ),
    ),
)

NO_GRAD_FN = Entry(
    code="autograd.no_grad_fn",
    title="Tensor does not require grad and has no grad_fn",
    meaning=(
        "backward() (or autograd.grad) was called on a tensor that is not connected to any "
        "parameter through the autograd graph, so there is nothing to differentiate."
    ),
    patterns=(
        r"element \d+ of tensors does not require grad and does not have a grad_fn",
        r"does not require grad and does not have a grad_fn",
        r"element \d+ of tensors does not require grad",
        r"One of the differentiated Tensors does not require grad",
    ),
    examples=(
        "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn",
        "RuntimeError: One of the differentiated Tensors does not require grad",
    ),
    summary=(
        "backward() was called at {{location}} on a tensor that is not connected to any parameter.",
        "backward() was called on a tensor that is not connected to any parameter.",
    ),
    causes=(
        Cause(
            "checkpoint_inputs",
            "Gradient checkpointing (the reentrant kind, the default of older transformers) "
            "with frozen inputs: with LoRA or other adapters the embeddings are frozen, so no "
            "input of a checkpointed block requires grad and its output has no grad_fn.",
            weight=2.5,
            signals=(
                r"gradient_checkpointing|checkpoint\.py|checkpoint\(|peft|lora|adapter|"
                r"enable_input_require_grads|CheckpointFunction",
            ),
            boost=3,
        ),
        Cause(
            "no_grad",
            "The loss was computed under torch.no_grad() or torch.inference_mode() (an "
            "evaluation context left open, a decorated function).",
            weight=2,
            signals=(r"no_grad|inference_mode|set_grad_enabled\(False\)",),
        ),
        Cause(
            "detached",
            "The graph was cut before the loss: .detach(), .item(), .numpy(), .data, or "
            "torch.tensor(...) around a prediction.",
            weight=2,
            signals=(r"detach\(|\.item\(|\.numpy\(|\.data\b|torch\.tensor\(",),
        ),
        Cause(
            "frozen",
            (
                "Every parameter that reaches the loss is frozen (requires_grad=False): "
                "{{frozen_modules}} frozen while the rest trains.",
                "Every parameter that reaches the loss is frozen (requires_grad=False).",
            ),
            weight=1.5,
            signals=(r"requires_grad_?\(False\)|requires_grad\s*=\s*False|freeze",),
        ),
        Cause(
            "non_differentiable",
            "The loss goes through a non-differentiable step (argmax, round, a comparison, "
            "integer casts), so no gradient path reaches the parameters.",
            weight=1,
            signals=(r"argmax|round\(|\.long\(\)|\.int\(\)",),
        ),
    ),
    first_steps=(
        "Print loss.requires_grad and loss.grad_fn, then walk back through the forward to "
        "the first tensor whose requires_grad is False.",
        "Check torch.is_grad_enabled() at the point where the loss is computed.",
    ),
    fixes=(
        Fix(
            "Make the checkpointed blocks' inputs require grad",
            "model.enable_input_require_grads()   # Hugging Face; before get_peft_model\n"
            "model.gradient_checkpointing_enable(\n"
            '    gradient_checkpointing_kwargs={"use_reentrant": False})',
            ("checkpoint_inputs",),
            needs=("mentions.checkpointing",),
            check="Applies when gradient checkpointing is on and the base model is frozen "
            "(LoRA, adapters): check the training arguments.",
        ),
        Fix(
            (
                "Take the training out of {{grad_off}}: autograd is off for all it runs",
                "Compute the training loss with grad enabled, outside torch.no_grad() and "
                "inference_mode()",
            ),
            "model.train()\n"
            "with torch.enable_grad():\n"
            "    loss = criterion(model(x), y)\n"
            "loss.backward()",
            ("no_grad",),
        ),
        Fix(
            "Keep the prediction a tensor of the graph",
            "loss = criterion(out, y)  # not criterion(out.detach(), y),\n"
            "# nor criterion(torch.tensor(out.tolist()), y)",
            ("detached",),
        ),
        Fix(
            "Unfreeze what should train",
            "for p in model.head.parameters():\n    p.requires_grad_(True)\n"
            "# Lightning: toggle_optimizer(opt) freezes every parameter outside opt until\n"
            "# untoggle_optimizer(opt): toggle the optimizer of what this loss trains",
            ("frozen",),
        ),
        Fix(
            "A differentiable surrogate",
            "loss = F.cross_entropy(logits, y)  # not a loss on logits.argmax(1)",
            ("non_differentiable",),
        ),
    ),
)

NON_SCALAR = Entry(
    code="autograd.non_scalar",
    title="backward() on a non-scalar tensor",
    meaning=(
        "backward() without arguments needs a single number; for a tensor with several "
        "elements autograd would need the gradient of some scalar with respect to it."
    ),
    patterns=(r"grad can be implicitly created only for scalar outputs",),
    examples=("RuntimeError: grad can be implicitly created only for scalar outputs",),
    summary=("backward() was called on a tensor with more than one element.",),
    causes=(
        Cause(
            "no_reduction",
            "The loss was built with reduction='none' (per-sample losses) and not reduced.",
            weight=2,
        ),
        Cause(
            "dp_outputs",
            "nn.DataParallel gathered one loss per GPU into a vector.",
            weight=0.5,
            signals=(r"DataParallel",),
        ),
    ),
    first_steps=("Print loss.shape just before backward().",),
    fixes=(
        Fix(
            "Reduce the loss",
            "loss = criterion(out, y).mean()\nloss.backward()",
            ("no_reduction", "dp_outputs"),
        ),
    ),
)

UNUSED_INPUT = Entry(
    code="autograd.unused_input",
    title="A differentiated tensor was not used in the graph",
    meaning=(
        "torch.autograd.grad was asked for the gradient with respect to a tensor that the "
        "output does not depend on."
    ),
    patterns=(r"appears to not have been used in the graph",),
    examples=(
        "RuntimeError: One of the differentiated Tensors appears to not have been used in the "
        "graph. Set allow_unused=True if this is the desired behavior.",
    ),
    summary=("autograd.grad was asked for a gradient of an input the output does not use.",),
    causes=(
        Cause(
            "unused",
            "An input or parameter passed to autograd.grad does not contribute to the output "
            "(an unused branch, a detached path).",
            weight=1,
        ),
    ),
    first_steps=("Check which input of autograd.grad gets no gradient path.",),
    fixes=(
        Fix(
            "Allow unused inputs (their gradient is None)",
            "grads = torch.autograd.grad(out, inputs, allow_unused=True, materialize_grads=True)",
            ("unused",),
        ),
    ),
)

ENTRIES = (
    LEAF_INPLACE,
    INPLACE_MODIFIED,
    BACKWARD_TWICE,
    NO_GRAD_FN,
    NON_SCALAR,
    UNUSED_INPUT,
)
