"""Shape errors: matrix products, broadcasting and batch sizes, views, convolutions."""

from __future__ import annotations

from torchdoctor.errors.catalog import Cause, Entry, Fields, Fix, first, rx

_SHAPE_STEPS = (
    "Print the shapes entering the failing line (print(x.shape) or an assert with the "
    "expected shape), or summarise the model with a dummy input "
    "(torchinfo.summary(model, input_size=...)) to see which layer receives what.",
    "Annotate tensors with their dimensions (# x: (B, L, D)) and assert them at layer "
    "boundaries; einops.rearrange makes reshapes explicit.",
)


def _matmul_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    m = rx(r"\((\d+)x(\d+) and (\d+)x(\d+)\)").search(message) or rx(
        r"m1: \[(\d+) x (\d+)\], m2: \[(\d+) x (\d+)\]"
    ).search(message)
    if m:
        a_rows, a_cols, b_rows, b_cols = (int(g) for g in m.groups())
        f["left"], f["right"] = f"{a_rows}x{a_cols}", f"{b_rows}x{b_cols}"
        f["got_features"], f["in_features"], f["out_features"] = a_cols, b_rows, b_cols
        return f
    m = rx(r"batch2 tensor to be: \[(\d+), (\d+)\] but got: \[(\d+), (\d+)\]").search(message)
    if m:
        f["expected_batch2"] = f"[{m.group(1)}, {m.group(2)}]"
        f["got_batch2"] = f"[{m.group(3)}, {m.group(4)}]"
    m = rx(r"mat \((\d+)x(\d+)\), vec \((\d+)\)").search(message)
    if m:
        f["left"], f["right"] = f"{m.group(1)}x{m.group(2)}", m.group(3)
    return f


MATMUL = Entry(
    code="shape.matmul",
    title="Matrix shapes cannot be multiplied",
    meaning=(
        "A matrix product (nn.Linear, torch.matmul, @, mm, bmm) needs the columns of the "
        "left operand to equal the rows of the right one. In an nn.Linear the left operand "
        "is the input (batch x features) and the right one the transposed weight "
        "(in_features x out_features), so the input's last dimension must equal in_features."
    ),
    patterns=(
        r"mat1 and mat2 shapes cannot be multiplied",
        r"size mismatch, m1: \[",
        r"size mismatch at \S*(?:THCTensorMathBlas|THTensorMath|Blas)",
        r"size mismatch, got input \(\d+\), mat",
        r"Expected size for first two dimensions of batch2 tensor",
        r"a and b must have same reduction dim",
        r"both arguments to matmul need to be at least 1D",
        r"shapes \(.*\) and \(.*\) not aligned",
    ),
    examples=(
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (64x784 and 512x10)",
        "RuntimeError: size mismatch, m1: [64 x 784], m2: [512 x 10] at "
        "/pytorch/aten/src/TH/generic/THTensorMath.cpp:41",
        "RuntimeError: Expected size for first two dimensions of batch2 tensor to be: "
        "[32, 64] but got: [32, 128].",
    ),
    summary=(
        "A {{left}} matrix cannot multiply a {{right}} one: {{got_features}} columns against "
        "{{in_features}} rows. For an nn.Linear: the layer expects {{in_features}} input "
        "features and receives {{got_features}}.",
        "bmm expected the second operand to start with {{expected_batch2}} but got {{got_batch2}}.",
        "The inner dimensions of a matrix product do not match.",
    ),
    extract=_matmul_fields,
    causes=(
        Cause(
            "in_features",
            (
                "An nn.Linear has in_features={{in_features}} but its input has "
                "{{got_features}} features: the flatten size was computed for another input "
                "resolution or another stack of conv/pool layers.",
                "An nn.Linear's in_features does not match the size of its (flattened) "
                "input: the flatten size was computed for another input resolution or "
                "another stack of layers.",
            ),
            weight=3,
        ),
        Cause(
            "flatten",
            "The input was not flattened, or flattened over the wrong dimensions "
            "(x.view(-1, n) that folds the batch into the features; torch.flatten(x) without "
            "start_dim=1).",
            weight=2,
        ),
        Cause(
            "transposed",
            "The operands are swapped or transposed (x @ W instead of x @ W.T), or the "
            "layout is (seq, batch, dim) where (batch, seq, dim) is expected (batch_first).",
            weight=1,
            signals=(r"bmm|batch2|matmul|rnn|lstm|gru|attention|batch_first",),
        ),
    ),
    first_steps=_SHAPE_STEPS,
    fixes=(
        Fix(
            (
                "Make the layer match the data: {{got_features}} input features",
                "Make the layer match the data",
            ),
            (
                "self.fc = nn.Linear({{got_features}}, {{out_features}})\n"
                "# or let PyTorch infer it at the first call:\n"
                "self.fc = nn.LazyLinear({{out_features}})",
                "self.fc = nn.LazyLinear(out_features)  # infers in_features at the first call",
            ),
            ("in_features",),
        ),
        Fix(
            "Flatten everything but the batch dimension",
            "x = torch.flatten(x, start_dim=1)  # (N, C, H, W) -> (N, C*H*W)",
            ("flatten",),
        ),
        Fix(
            "Compute the flatten size from a dummy input",
            "with torch.no_grad():\n"
            "    n_features = self.features(torch.zeros(1, 3, 224, 224)).flatten(1).shape[1]",
            ("in_features", "flatten"),
        ),
        Fix(
            "Say the layout explicitly",
            'x = einops.rearrange(x, "s b d -> b s d")\n'
            "layer = nn.TransformerEncoderLayer(d_model, nhead, batch_first=True)",
            ("transposed",),
        ),
    ),
)


def _size_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    m = rx(
        r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at non-singleton "
        r"dimension (\d+)"
    ).search(message)
    if m:
        f["size_a"], f["size_b"], f["dim"] = int(m.group(1)), int(m.group(2)), int(m.group(3))
    m = rx(r"input batch_size \((\d+)\) to match target batch_size \((\d+)\)").search(message)
    if m:
        f["input_batch"], f["target_batch"] = int(m.group(1)), int(m.group(2))
    m = rx(r"Target size \((.+?)\) must be the same as input size \((.+?\))\)").search(message)
    if m:
        f["target_shape"], f["input_shape"] = m.group(1), m.group(2)
    m = rx(r"Expected target size (\[[\d, ]+\]), got (\[[\d, ]+\])").search(message)
    if m:
        f["expected_target"], f["target_shape"] = m.group(1), m.group(2)
    m = rx(r"got (\[[\d, ]+\]) at entry (\d+) and (\[[\d, ]+\]) at entry (\d+)").search(message)
    if m:
        f["stack_a"], f["stack_b"] = m.group(1), m.group(3)
    m = rx(r"except in dimension (\d+)\. Expected size (\d+) but got size (\d+)").search(message)
    if m:
        f["cat_dim"], f["expected_size"], f["got_size"] = m.group(1), m.group(2), m.group(3)
    return f


SIZE_MISMATCH = Entry(
    code="shape.size_mismatch",
    title="Tensor sizes do not match",
    meaning=(
        "Two tensors that must agree in size do not: an elementwise operation whose shapes "
        "cannot be broadcast (each dimension must be equal, or 1 in one of them), a loss whose "
        "input and target batches differ, or tensors joined with cat/stack that differ in a "
        "dimension that must be equal."
    ),
    patterns=(
        r"The size of tensor a \(\d+\) must match the size of tensor b",
        r"Expected input batch_size \(\d+\) to match target batch_size",
        r"Sizes of tensors must match except in dimension",
        r"stack expects each tensor to be equal size",
        r"Target size \(.*\) must be the same as input size",
        r"Expected target size \[[\d, ]+\], got",
        r"input and target shapes do not match",
        r"value tensor of shape \[.*\] cannot be broadcast",
        r"output with shape \[.*\] doesn't match the broadcast shape",
        r"Expected hidden\[?\d?\]? size",
    ),
    examples=(
        "RuntimeError: The size of tensor a (4) must match the size of tensor b (5) at "
        "non-singleton dimension 1",
        "ValueError: Expected input batch_size (64) to match target batch_size (32).",
        "RuntimeError: stack expects each tensor to be equal size, but got [3, 224, 224] at "
        "entry 0 and [3, 224, 180] at entry 1",
        "ValueError: Target size (torch.Size([8])) must be the same as input size "
        "(torch.Size([8, 1]))",
    ),
    summary=(
        "Sizes {{size_a}} and {{size_b}} meet at dimension {{dim}}, where neither is 1, so "
        "the tensors cannot be broadcast together.",
        "The model produced {{input_batch}} predictions but there are {{target_batch}} targets.",
        "The target has shape {{target_shape}} but the input has {{input_shape}}.",
        "The loss expected targets of size {{expected_target}} but got {{target_shape}}.",
        "Tensors stacked into one batch differ in size: {{stack_a}} and {{stack_b}}.",
        "Tensors joined along dimension {{cat_dim}} differ elsewhere: {{expected_size}} vs "
        "{{got_size}}.",
        "Two tensors that must agree in size do not.",
    ),
    extract=_size_fields,
    causes=(
        Cause(
            "image_channels",
            "An image with another number of channels than the model or the normalisation "
            "expects: a PNG with an alpha channel (RGBA, 4) or a greyscale image (1) where 3 "
            "(RGB) are expected.",
            evidence="Sizes {{size_a}} and {{size_b}} are likely image channels: a PNG with an "
            "alpha channel (RGBA) or a greyscale image where RGB (3) is expected.",
            weight=0,
            when=lambda f: {f["size_a"], f["size_b"]} in ({3, 4}, {1, 3}) and f["dim"] in (0, 1),
            boost=12,
            only_when=True,
        ),
        Cause(
            "batch_folded",
            (
                "A reshape folded the batch into the features (x.view(-1, N) with the wrong N) "
                "so the model returns {{input_batch}} rows for {{target_batch}} targets.",
                "A reshape folded the batch into the features (x.view(-1, N) with the wrong "
                "N), so the model returns another number of rows than there are targets.",
            ),
            weight=1,
            signals=(r"batch_size",),
        ),
        Cause(
            "target_layout",
            "The targets have another layout than the output: (N,) against (N, 1) (a missing "
            "squeeze or unsqueeze), one-hot against class indices, or (N, L, C) where the loss "
            "wants (N, C, L).",
            weight=1,
            signals=(r"target",),
        ),
        Cause(
            "broadcast",
            "An elementwise operation between tensors whose shapes disagree: a reduction "
            "without keepdim=True, a transposed operand, or masks built for another sequence "
            "length.",
            weight=1,
            signals=(r"non-singleton dimension|broadcast",),
        ),
        Cause(
            "collate",
            "Samples of one batch differ in size (images of varied resolution, sequences of "
            "varied length); the default collate function can only stack equal shapes.",
            weight=0.5,
            signals=(r"stack expects|collate|DataLoader worker|fetch\.py",),
            boost=12,
        ),
        Cause(
            "last_batch",
            "The last, smaller batch of an epoch meets something sized for the full batch "
            "(a hidden state, a mask or a buffer created with a fixed batch size).",
            weight=0.8,
        ),
        Cause(
            "cat_dim",
            "cat joins along the wrong dimension: the tensors must agree on every dimension "
            "except the one being joined.",
            weight=0.3,
            signals=(r"except in dimension",),
        ),
    ),
    first_steps=_SHAPE_STEPS,
    fixes=(
        Fix(
            "Convert every image to RGB when loading it",
            'img = Image.open(path).convert("RGB")  # drops alpha, expands greyscale',
            ("image_channels",),
        ),
        Fix(
            "Keep the batch dimension when reshaping",
            "x = x.view(x.size(0), -1)  # not x.view(-1, 784)",
            ("batch_folded",),
        ),
        Fix(
            "Give the loss the target layout it expects",
            "loss = F.binary_cross_entropy_with_logits(logits.squeeze(1), y.float())  # (N,)\n"
            "loss = F.cross_entropy(logits.transpose(1, 2), y)  # (N, L, C) -> (N, C, L)",
            ("target_layout",),
        ),
        Fix(
            "Keep reduced dimensions for broadcasting",
            "x = x - x.mean(dim=-1, keepdim=True)",
            ("broadcast",),
        ),
        Fix(
            "Pad variable-length samples in a collate function",
            "from torch.nn.utils.rnn import pad_sequence\n\n"
            "def collate(batch):\n"
            "    seqs, labels = zip(*batch)\n"
            "    return pad_sequence(seqs, batch_first=True), torch.tensor(labels)\n\n"
            "loader = DataLoader(ds, batch_size=32, collate_fn=collate)",
            ("collate",),
        ),
        Fix(
            "Size per-batch state from the batch itself",
            "h = torch.zeros(num_layers, x.size(0), hidden, device=x.device)\n"
            "# or drop the ragged last batch: DataLoader(..., drop_last=True)",
            ("last_batch",),
        ),
    ),
)


def _view_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    m = rx(r"shape '(\[[-\d, ]*\])' is invalid for input of size (\d+)").search(message)
    if m:
        f["target_shape"], f["numel"] = m.group(1), int(m.group(2))
    return f


VIEW = Entry(
    code="shape.view",
    title="Invalid view or reshape",
    meaning=(
        "view/reshape must keep the number of elements, and view additionally needs memory "
        "laid out so that no data has to move. A size computed for another batch size or "
        "resolution, or a view of a transposed (non-contiguous) tensor, fails here."
    ),
    patterns=(
        r"shape '\[[-\d, ]*\]' is invalid for input of size \d+",
        r"view size is not compatible with input tensor's size and stride",
        r"cannot reshape tensor of \d+ elements into shape",
        r"size '\[.*\]' is invalid for input with \d+ elements",
    ),
    examples=(
        "RuntimeError: shape '[64, 784]' is invalid for input of size 1000",
        "RuntimeError: view size is not compatible with input tensor's size and stride (at "
        "least one dimension spans across two contiguous subspaces). Use .reshape(...) instead.",
        "RuntimeError: invalid argument 2: size '[-1 x 400]' is invalid for input with 3136 "
        "elements at ../aten/src/TH/THStorage.c:84",
    ),
    summary=(
        "Reshaping {{numel}} elements into {{target_shape}} is impossible.",
        "The tensor cannot be viewed with that shape.",
    ),
    extract=_view_fields,
    causes=(
        Cause(
            "non_contiguous",
            "The tensor is not contiguous (after transpose, permute or expand), so view "
            "cannot reinterpret its memory.",
            weight=0.5,
            signals=(r"stride|contiguous",),
            boost=12,
        ),
        Cause(
            "hardcoded",
            "A hard-coded size in view/reshape (the batch size, channels x height x width) "
            "does not fit this tensor: the last batch is smaller, or the input resolution or "
            "layer sizes changed.",
            weight=2,
        ),
        Cause(
            "batch_dim",
            "The batch dimension is not kept explicit, so a wrong feature size silently moves "
            "elements between samples until the count no longer divides.",
            weight=1,
        ),
    ),
    first_steps=_SHAPE_STEPS,
    fixes=(
        Fix(
            "Copy when needed",
            "x = x.transpose(1, 2).reshape(b, n, -1)  # or .contiguous().view(...)",
            ("non_contiguous",),
        ),
        Fix(
            "Derive sizes from the tensor",
            "x = x.view(x.size(0), -1)\nx = torch.flatten(x, start_dim=1)",
            ("hardcoded", "batch_dim"),
        ),
    ),
)


def _conv_fields(message: str, text: str) -> Fields:
    f: Fields = {}
    m = rx(
        r"weight of size (\[[\d, ]+\]), expected input(\[[\d, ]+\]) to have (\d+) channels, but "
        r"got (\d+) channels"
    ).search(message)
    if m:
        f["weight_shape"], f["input_shape"] = m.group(1), m.group(2)
        f["expected_channels"], f["got_channels"] = int(m.group(3)), int(m.group(4))
        dims = [int(d) for d in m.group(2).strip("[]").split(",")]
        f["input_last_dim"] = dims[-1]
        return f
    m = rx(
        r"Expected (\d)D \(unbatched\) or (\d)D \(batched\) input to (\w+), but got input of "
        r"size: (\[[\d, ]+\])"
    ).search(message)
    if m:
        f["layer"], f["input_shape"] = m.group(3), m.group(4)
        f["input_dims"] = len(m.group(4).strip("[]").split(","))
        f["batched_dims"] = int(m.group(2))
        return f
    m = rx(
        r"Expected (\d)-dimensional input for \d-dimensional weight (\[[\d, ]+\]), but got "
        r"(\d)-dimensional input of size (\[[\d, ]+\])"
    ).search(message)
    if m:
        f["batched_dims"], f["weight_shape"] = int(m.group(1)), m.group(2)
        f["input_dims"], f["input_shape"] = int(m.group(3)), m.group(4)
    return f


CONV_INPUT = Entry(
    code="shape.conv_input",
    title="Convolution input has the wrong shape",
    meaning=(
        "Convolutions take (N, C, H, W) for 2-D (or (C, H, W) unbatched): the channel "
        "dimension must equal the layer's in_channels, the channel axis must come before the "
        "spatial ones, and the input must be at least as large as the kernel."
    ),
    patterns=(
        r"expected input\[[\d, ]+\] to have \d+ channels, but got \d+ channels",
        r"Expected \dD \(unbatched\) or \dD \(batched\) input to conv",
        r"Expected \d-dimensional input for \d-dimensional weight",
        r"Kernel size can't be greater than actual input size",
    ),
    examples=(
        "RuntimeError: Given groups=1, weight of size [64, 3, 7, 7], expected input[8, 1, 224, "
        "224] to have 3 channels, but got 1 channels instead",
        "RuntimeError: Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input "
        "of size: [64, 784]",
        "RuntimeError: Expected 4-dimensional input for 4-dimensional weight [32, 1, 5, 5], but "
        "got 3-dimensional input of size [1, 28, 28] instead",
    ),
    summary=(
        "The layer (weight {{weight_shape}}) expects {{expected_channels}} input channels but "
        "the input {{input_shape}} has {{got_channels}}.",
        "{{layer}} received an input of shape {{input_shape}}.",
        "The layer (weight {{weight_shape}}) received a {{input_dims}}-D input of shape "
        "{{input_shape}}.",
        "The convolution received an input of the wrong shape.",
    ),
    extract=_conv_fields,
    causes=(
        Cause(
            "channels_last",
            "The image is channels-last, (N, H, W, C) from NumPy or PIL, and needs "
            "permute(0, 3, 1, 2).",
            weight=1,
            when=lambda f: f["input_last_dim"] == f["expected_channels"],
            boost=12,
            only_when=True,
        ),
        Cause(
            "grayscale",
            (
                "The images have {{got_channels}} channel(s) and the model expects "
                "{{expected_channels}}: grayscale against RGB (or RGBA).",
                "The number of channels differs between the data and the model: grayscale "
                "against RGB (or RGBA).",
            ),
            weight=2,
            signals=(r"channels",),
        ),
        Cause(
            "flattened",
            "A flattened (N, features) tensor reached a conv layer: the data pipeline "
            "flattens images (MNIST as 784-vectors), or layers are applied in the wrong order.",
            weight=1,
            when=lambda f: f["input_dims"] == 2,
            boost=12,
            only_when=True,
        ),
        Cause(
            "no_batch",
            "A single sample without its batch dimension; add unsqueeze(0).",
            weight=1,
            when=lambda f: f["input_dims"] == f["batched_dims"] - 1,
            boost=12,
            only_when=True,
        ),
        Cause(
            "too_small",
            "After earlier downsampling the input is smaller than the kernel: the images are "
            "too small for this network.",
            weight=0.2,
            signals=(r"Kernel size can't be greater",),
            boost=12,
        ),
    ),
    first_steps=_SHAPE_STEPS,
    fixes=(
        Fix(
            "Channels first",
            "x = x.permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW",
            ("channels_last",),
        ),
        Fix(
            "Make every image RGB (or change the first layer)",
            'img = Image.open(path).convert("RGB")\n'
            "# or: model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)",
            ("grayscale",),
        ),
        Fix(
            "Restore the image shape",
            "x = x.view(-1, 1, 28, 28)",
            ("flattened",),
        ),
        Fix("Add the batch dimension", "out = model(img.unsqueeze(0))", ("no_batch",)),
        Fix(
            "Larger inputs or less downsampling",
            "transforms.Resize(224)  # or remove a pooling layer",
            ("too_small",),
        ),
    ),
)

BATCHNORM_BATCH1 = Entry(
    code="shape.batchnorm_batch1",
    title="BatchNorm got a batch of one",
    meaning=(
        "In training mode BatchNorm normalises with the batch's own statistics, which needs "
        "more than one value per channel."
    ),
    patterns=(r"Expected more than 1 value per channel when training",),
    examples=(
        "ValueError: Expected more than 1 value per channel when training, got input size "
        "torch.Size([1, 256])",
    ),
    summary=(
        "BatchNorm received {{input_size}} in training mode: one value per channel.",
        "BatchNorm received a single value per channel in training mode.",
    ),
    extract=lambda message, text: (
        {"input_size": s}
        if (s := first(r"got input size (torch\.Size\(\[[\d, ]+\]\))", message))
        else {}
    ),
    causes=(
        Cause(
            "last_batch",
            "The last batch of the epoch holds a single sample.",
            weight=2,
        ),
        Cause(
            "not_eval",
            "Inference runs in training mode: model.eval() was not called before predicting "
            "one sample.",
            weight=1.5,
            signals=(r"predict|infer|eval",),
        ),
    ),
    first_steps=("Check the size of the last batch: len(dataset) % batch_size.",),
    fixes=(
        Fix(
            "Drop the ragged last batch",
            "loader = DataLoader(ds, batch_size=32, shuffle=True, drop_last=True)",
            ("last_batch",),
        ),
        Fix(
            "Predict in eval mode",
            "model.eval()\nwith torch.inference_mode():\n    out = model(x)",
            ("not_eval",),
        ),
    ),
)

ENTRIES = (MATMUL, SIZE_MISMATCH, VIEW, CONV_INPUT, BATCHNORM_BATCH1)
