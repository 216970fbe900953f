"""The loss's autograd graph, read when backward() is called on a sampled step (the graph is
whole then), and what it tells:

- detached: the loss reaches no parameter at all (a walk towards the leaves that stops at the
  first parameter it finds; one that no optimizer holds is unoptimized_parameters' case):
  backward() gives the model no gradient. The
  usual cause is a loss rebuilt from plain numbers (`loss.item()`, `.detach()`, `.data`) and
  made to require grad again so that backward() stops complaining.
- accumulation: how each micro-batch's loss is scaled before backward(): divided (or
  multiplied) by a number, by a tensor (a token count: a normalisation of its own), or not at
  all. The update compares it with the number of backward() calls since the last update and of
  batches fetched (one batch per backward() is what gradient accumulation looks like; a GAN's
  discriminator runs two backward() calls on one batch, on purpose undivided). A loop with no
  DataLoader (nanoGPT slices its own batches) counts when one model was called once per
  backward() (a GAN's discriminator step calls its generator as well).
- loss inputs (near the root): nll_loss fed probabilities (softmax) instead of log-probabilities
  (also through ops that only select or reshape them, such as a graph network's
  `output[train_mask]`);
  log_softmax over another axis than the one nll_loss reads classes from (classes are axis 1);
  softmax before cross_entropy (which applies log_softmax itself); a sigmoid before
  binary_cross_entropy_with_logits (which applies one itself); log_softmax over an axis of
  one element (cross_entropy on one output: always 0); class probabilities along the
  last axis of a 3-d input, where cross_entropy reads classes along axis 1; logits flattened
  from a time-major [T, N, C] tensor against targets flattened from a batch-major [N, T] one;
  predictions broadcast against targets of another shape by mse_loss, l1_loss, smooth_l1_loss
  or huber_loss.
- autocast: with autocast on for the model's device, whether any matmul or convolution ran in
  lower precision (autocast turned on for another device than the model's is seen at the
  model call).
"""

from __future__ import annotations

from typing import Any

from torchdoctor.telemetry.graph_walk import walk

WALK = 20_000  # nodes walked at most looking for a parameter
NEAR = 200  # nodes from the root looked at for loss functions
CONFIRM = 2  # sampled observations before a finding about scaling or detachment

_NLL = ("NllLossBackward0", "NllLoss2dBackward0")
_VIEWS = ("ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0")
# Ops that pick, reorder, reshape or copy values without changing them: probabilities stay
# probabilities through them (a graph network's `output[train_mask]`, a language model's
# `.view(-1, vocab)`, a classifier's `out[:, -1]`).
_SELECTIONS = frozenset(
    {
        *_VIEWS,
        "IndexBackward0",
        "IndexSelectBackward0",
        "MaskedSelectBackward0",
        "GatherBackward0",
        "SliceBackward0",
        "SelectBackward0",
        "TransposeBackward0",
        "TransposeBackward1",
        "PermuteBackward0",
        "SqueezeBackward0",
        "SqueezeBackward1",
        "SqueezeBackward2",
        "UnsqueezeBackward0",
        "CloneBackward0",
        "ToCopyBackward0",
        "SplitBackward0",
        "SplitWithSizesBackward0",
        "UnbindBackward0",
        "AsStridedBackward0",
    }
)
SELECTIONS_DEEP = 8  # selections followed at most
_POINTWISE_LOSSES = {
    "MseLossBackward0": "mse_loss",
    "SmoothL1LossBackward0": "smooth_l1_loss",
    "HuberLossBackward0": "huber_loss",
}
_MATMULS = {
    "AddmmBackward0": ("_saved_mat1", "_saved_mat2"),
    "MmBackward0": ("_saved_self", "_saved_mat2"),
    "BmmBackward0": ("_saved_self", "_saved_mat2"),
    "ConvolutionBackward0": ("_saved_weight", "_saved_input"),
}


LOWER_PRECISION = ("torch.float16", "torch.bfloat16")


class LossGraphs:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.detached = 0  # consecutive sampled backward() calls with a detached loss
        self.scales: list[Any] = []  # the step's micro-batch loss scales
        self.site: str | None = None  # where the last sampled backward() was called
        self.observed: dict[Any, int] = {}  # accumulation reading -> sampled steps in a row
        self.autocast_on = False  # autocast is on for the model's device in this step
        self.autocast_checked = False
        self.called: set[int] = set()  # the models called since the last update
        self.calls = 0

    # -- at the model call: autocast for the wrong device --------------------------------------
    def on_model_call(self, module: Any) -> None:
        self.called.add(id(module))
        self.calls += 1
        state = self.host.rec.state
        if self.autocast_checked or not state.autocast:
            return
        first = next(module.parameters(), None)
        if first is None:
            return
        device = first.device.type
        enabled = [str(d) for d, _dtype in state.autocast]
        if device in enabled:
            # autocast asked for float32 (nanoGPT's --dtype=float32 on a GPU): nothing to lower
            self.autocast_on = any(
                str(d) == device and str(dtype) in LOWER_PRECISION for d, dtype in state.autocast
            )
            return
        self.autocast_checked = True
        data = {
            "problem": "device",
            "model": self.host.rec.models.name_of(module),
            "model_device": device,
            "autocast": [[str(d), str(t).removeprefix("torch.")] for d, t in state.autocast],
            "step": self.host.rec.step,
            "site": self.host.user_site(),
        }
        self.host.emit("autocast_unused", data, key="device")

    # -- at backward() ---------------------------------------------------------------------------
    def on_backward(self, loss: Any) -> None:
        torch = self.host.torch
        if not isinstance(loss, torch.Tensor):
            return
        self.site = self.host.user_site()
        root = loss.grad_fn
        self._detached(root, loss)
        self.scales.append(_scale(torch, root))
        if root is not None:
            self._loss_inputs(root)
            if self.autocast_on and not self.autocast_checked:
                self.autocast_checked = True
                self._precision(root)
        self.autocast_on = False

    def _detached(self, root: Any, loss: Any) -> None:
        ids = self.host.param_ids()
        if not ids:
            return
        reaches, leaves = _reaches(root, ids, self.host.torch.nn.Parameter)
        if reaches is None:
            return  # too big to walk: unknown
        if reaches or any(leaf["parameter"] for leaf in leaves):
            self.detached = 0  # parameters no optimizer holds: unoptimized_parameters' case
            return
        self.detached += 1
        if self.detached < CONFIRM:
            return
        data = {
            "step": self.host.rec.step,
            "site": self.site,
            "leaf": root is None,
            "leaves": leaves,
            "shape": list(loss.shape),
        }
        self.host.emit("detached_loss", data, key="detached")

    # -- at the update: the micro-batches' scaling against their number -------------------------
    def before_update(self, step: int) -> None:
        scales, self.scales = self.scales, []
        called, calls = len(self.called), self.calls
        self.called, self.calls = set(), 0
        k, fetches = int(self.host.rec.state.micro), self.host.fetches
        if k < 2 or len(scales) != k:
            return
        # One batch per backward(): k DataLoader fetches; with no DataLoader (a loop that
        # slices its own batches, as nanoGPT's get_batch), one model called once per
        # backward(). A GAN's discriminator step calls its generator too.
        if fetches != k and not (fetches == 0 and called == 1 and calls == k):
            return
        if all(s is None for s in scales):
            reading: tuple[str, Any] = ("not_divided", None)
        elif len(set(scales)) == 1 and isinstance(scales[0], int) and scales[0] != k:
            reading = ("divided_by", scales[0])
        else:
            self.observed.clear()
            return
        count = self.observed.get(reading, 0) + 1
        self.observed = {reading: count}
        if count < CONFIRM:
            return
        data = {
            "problem": reading[0],
            "divisor": reading[1],
            "micro_batches": k,
            "fetches": fetches,
            "step": step,
            "site": self.site,
        }
        self.host.emit("accumulation", data, key=reading[0])

    # -- the loss functions near the root --------------------------------------------------------
    def _loss_inputs(self, root: Any) -> None:
        for node, parent in walk(root, NEAR):
            name = type(node).__name__
            if name in _NLL:
                self._nll(node)
            elif name == "MulBackward0":
                self._soft_targets(node)
            elif name == "LogSoftmaxBackward0":
                self._single_class(node)
            elif name == "BinaryCrossEntropyWithLogitsBackward0":
                self._bce_logits(node)
            elif name in _POINTWISE_LOSSES:
                saved = getattr(node, "_saved_self", None)
                self._broadcast(node, _POINTWISE_LOSSES[name], saved)
            elif name == "SubBackward0" and type(parent).__name__ == "AbsBackward0":
                self._broadcast(node, "l1_loss", getattr(parent, "_saved_self", None))

    def _finding(self, problem: str, data: dict[str, Any]) -> None:
        data.update(problem=problem, step=self.host.rec.step, site=self.site)
        self.host.emit("loss_inputs", data, key=(problem, self.site))

    def _nll(self, node: Any) -> None:
        source = node.next_functions[0][0]
        logp = getattr(node, "_saved_self", None)
        if source is None or logp is None:
            return
        class_dim = 1 if logp.dim() >= 2 else 0
        if _is(_below_selections(source), "SoftmaxBackward0"):
            self._finding("nll_on_probabilities", {"shape": list(logp.shape)})
            return
        # The axes are compared only when log_softmax feeds nll_loss directly: a selection in
        # between may drop or move axes.
        if type(source).__name__ != "LogSoftmaxBackward0":
            return
        dim = int(source._saved_dim) % max(1, logp.dim())
        if dim != class_dim:
            data = {"dim": dim, "class_dim": class_dim, "shape": list(logp.shape)}
            self._finding("log_softmax_axis", data)
        below = source.next_functions[0][0]
        if _is(_below_selections(below), "SoftmaxBackward0"):
            self._finding("softmax_before_cross_entropy", {"shape": list(logp.shape)})
        elif below is not None and type(below).__name__ in _VIEWS:
            self._flatten_order(below, getattr(node, "_saved_target", None))

    def _bce_logits(self, node: Any) -> None:
        """binary_cross_entropy_with_logits applies a sigmoid: one before it is a second."""
        if _is(_below_selections(node.next_functions[0][0]), "SigmoidBackward0"):
            logits = getattr(node, "_saved_self", None)
            shape = list(logits.shape) if logits is not None else []
            self._finding("sigmoid_before_bce_with_logits", {"shape": shape})

    def _single_class(self, node: Any) -> None:
        """log_softmax over an axis of one element is 0 whatever its input: cross_entropy on
        a model with one output gives a constant loss and no gradient."""
        result = getattr(node, "_saved_result", None)
        if result is None or result.dim() == 0:
            return
        dim = int(node._saved_dim) % result.dim()
        if result.shape[dim] == 1:
            self._finding("single_class", {"shape": list(result.shape), "dim": dim})

    def _flatten_order(self, view: Any, target: Any) -> None:
        """Logits flattened from [T, N, ...] against targets flattened from [N, T]."""
        base = getattr(target, "_base", None)
        sizes = getattr(view, "_saved_self_sym_sizes", None)
        if base is None or sizes is None:
            return
        logits = tuple(int(s) for s in sizes)
        targets = tuple(int(s) for s in base.shape)
        if (
            len(logits) >= 3
            and len(targets) == 2
            and logits[:2] == targets[::-1]
            and logits[0] != logits[1]
        ):
            self._finding("flatten_order", {"logits": list(logits), "targets": list(targets)})

    def _soft_targets(self, node: Any) -> None:
        """cross_entropy with class probabilities: -(log_softmax(x, 1) * p)."""
        below = node.next_functions[0][0]
        if below is None or type(below).__name__ != "LogSoftmaxBackward0":
            return
        probs = getattr(node, "_saved_other", None)
        torch = self.host.torch
        if probs is None or probs.requires_grad or not probs.is_floating_point():
            return
        if _is(_below_selections(below.next_functions[0][0]), "SoftmaxBackward0"):
            self._finding("softmax_before_cross_entropy", {"shape": list(probs.shape)})
        ndim = probs.dim()
        dim = int(below._saved_dim) % max(1, ndim)
        if ndim < 3 or dim == ndim - 1:
            return
        errors = torch.stack(
            [
                (probs.sum(dim) - 1).abs().amax(),
                (probs.sum(-1) - 1).abs().amax(),
            ]
        ).float()
        shape = list(probs.shape)

        def done(values: list[float]) -> None:
            along_dim, along_last = values
            if along_dim > 1e-2 and along_last < 1e-3:
                self._finding("class_axis", {"shape": shape, "dim": dim})

        self.host.rec.readback.submit(errors, done)

    def _broadcast(self, node: Any, loss: str, result: Any) -> None:
        if result is None:
            return
        for child, _ in node.next_functions:
            if child is None or type(child).__name__ != "ExpandBackward0":
                continue
            sizes = getattr(child, "_saved_self_sym_sizes", None)
            if sizes is None:
                continue
            before = [int(s) for s in sizes]
            after = list(result.shape)
            if before != after:
                self._finding("broadcast", {"loss": loss, "prediction": before, "result": after})
                return

    # -- autocast: lower precision anywhere? -----------------------------------------------------
    def _precision(self, root: Any) -> None:
        torch = self.host.torch
        full = low = 0
        for node, _up in walk(root, WALK, depth_first=True):
            names = _MATMULS.get(type(node).__name__)
            if names is None:
                continue
            dtypes = set()
            for name in names:
                try:
                    t = getattr(node, name)
                except RuntimeError:  # freed or not saved
                    t = None
                if isinstance(t, torch.Tensor):
                    dtypes.add(t.dtype)
            if dtypes & {torch.float16, torch.bfloat16}:
                low += 1
            elif torch.float32 in dtypes:
                full += 1
        if full and not low:
            state = self.host.rec.state
            data = {
                "problem": "float32",
                "ops": full,
                "autocast": [[str(d), str(t).removeprefix("torch.")] for d, t in state.autocast],
                "step": self.host.rec.step,
                "site": self.site,
            }
            self.host.emit("autocast_unused", data, key="float32")


def _below_selections(node: Any) -> Any:
    """The first node at or below `node` that is no selection (_SELECTIONS), following each
    selection's input."""
    for _ in range(SELECTIONS_DEEP):
        if node is None or type(node).__name__ not in _SELECTIONS or not node.next_functions:
            return node
        node = node.next_functions[0][0]
    return node


def _is(node: Any, name: str) -> bool:
    return node is not None and type(node).__name__ == name


def _reaches(root: Any, ids: set[int], parameter: type) -> tuple[bool | None, list[dict[str, Any]]]:
    """Whether the graph reaches one of the parameters `ids` (None: too big to tell), and a
    few of the leaves it does reach when it reaches none (the walk stops at the first other
    `parameter`)."""
    if root is None:
        return False, []
    leaves: list[dict[str, Any]] = []
    count = 0
    for node, _up in walk(root, WALK, depth_first=True):
        count += 1
        variable = getattr(node, "variable", None)
        if variable is None:
            continue
        if id(variable) in ids:
            return True, []
        is_parameter = isinstance(variable, parameter)
        if is_parameter or len(leaves) < 3:
            leaves.append({"shape": list(variable.shape), "parameter": is_parameter})
        if is_parameter:
            return False, leaves
    if count >= WALK or not leaves:  # no leaf at all: a graph we cannot read, not a detached one
        return None, []
    return False, leaves


def _scale(torch: Any, root: Any) -> Any:
    """How the loss was scaled at its root: an int d (divided by d), 'tensor' (by a tensor: a
    count of its own), 'other' (by a number that is no whole divisor) or None (not at all)."""
    wrapped = (torch.int64, torch.float64)  # how Python numbers are held in the graph
    for _ in range(4):  # scalings by 1 (Hugging Face's Trainer: `loss / 1 * 1`) say nothing
        if root is None:
            return None
        name = type(root).__name__
        if name not in ("DivBackward0", "MulBackward0"):
            return None
        other = getattr(root, "_saved_other", None)
        if (
            not isinstance(other, torch.Tensor)
            or other.dim() != 0
            or other.device.type != "cpu"
            or other.dtype not in wrapped
        ):
            return "tensor"
        value = float(other)
        d = value if name == "DivBackward0" else (1.0 / value if value else 0.0)
        whole = round(d)
        if whole != 1 or abs(d - 1.0) > 1e-9:
            return int(whole) if whole >= 2 and abs(d - whole) < 1e-6 * d else "other"
        root = next((f for f, _i in root.next_functions if f is not None), None)
    return None
