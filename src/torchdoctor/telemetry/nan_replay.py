"""Finding where the first non-finite value came from, once the cheap per-step check fires.

Dormant cost: none beyond the step's finiteness check (loss value and total gradient norm).
When a step goes non-finite, before the optimizer applies it, its batch is replayed through
the models (same weights, same inputs, same CPU random state; buffers restored afterwards):
  forward   every torch op's output is checked; the first op with a non-finite output from
            finite inputs is the origin (op, module, file:line).
  backward  if the forward stays finite, a backward replay from the model output (a
            surrogate all-ones gradient; .grad untouched) with a hook on every autograd node
            finds the first node that turns finite gradients non-finite (e.g. SqrtBackward0),
            and the module and line whose forward created it.
  loss      if the model's own backward stays finite too, the loss computation outside the
            modules made it; the loss graph's nodes are named.
  optimizer if the model's weights are already non-finite, an earlier update put them there.
On CUDA the check is read back a step late, after that update; the localizer then arms a
synchronous check so the next occurrence is caught before its update.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from torchdoctor.frames import site, user_frame
from torchdoctor.telemetry.as_caller import call_as_caller
from torchdoctor.telemetry.graph_walk import node_names, walk
from torchdoctor.telemetry.local_shards import has_sharded_state, largest_values, local

if TYPE_CHECKING:  # a diagnosis module: loaded when a replay runs, not with the telemetry
    from torchdoctor.diagnose.nan import BadGradient, BadWeight, NanOrigin, TensorStats


class NanLocalizer:
    def __init__(self, recorder: Any) -> None:
        self.rec = recorder
        self.localized = False
        self.armed = False
        recorder.nonfinite.localizers.append(self)

    def __call__(self, rec: Any, info: dict[str, Any]) -> None:
        if self.localized:
            return
        if info.get("late"):
            # Too late to replay (the update has happened): catch the next one in time.
            self.armed = True
            rec.arm_sync_check()
            rec.event("nan_armed", {"step": info.get("step")})
            return
        self.localized = True
        started = time.perf_counter()
        origin = self.localize(info)
        origin.replay_seconds = round(time.perf_counter() - started, 4)
        rec.event("nan_origin", origin.to_json())

    # -- the replay --------------------------------------------------------------------------
    def localize(self, info: dict[str, Any]) -> NanOrigin:
        """Where the first non-finite value came from, found stage by stage."""
        from torchdoctor.diagnose.nan import NanOrigin

        rec = self.rec
        torch = rec.torch
        state = rec.state
        losses = [float(v) for v in info.get("losses") or []]
        origin = NanOrigin(
            step=info.get("step"),
            loss=losses[-1] if losses else None,
            grad_norm=info.get("grad_norm"),
            lr=rec.lr(),
            guard=bool(rec.host.config.guard),
            backward_site=_site(state.backward_site),
            autocast={
                device: str(dtype).removeprefix("torch.") for device, dtype in state.autocast
            },
            bad_gradients=_bad_gradients(rec, info.get("params") or []),
        )
        # Weights and the batch first: read on this rank's shards, so a sharded model is
        # judged as far as it can be without running it again.
        if any(has_sharded_state(m) for m, _label in rec.models.models()):
            origin.sharded = True
        bad_weights = _bad_weights(rec)
        if bad_weights:
            origin.stage, origin.bad_weights = "optimizer", bad_weights
            origin.location = bad_weights[0].module
            return origin
        tape = [(_unwrapped(m), args, kwargs) for m, args, kwargs in state.tape]
        if not tape:
            origin.note = "no model call was seen in this step, so it could not be replayed"
            return origin
        bad_input = _bad_inputs(torch, tape)
        if bad_input is not None:
            origin.stage, origin.location, origin.input = "data", "input batch", bad_input
            return origin
        if origin.sharded or any(has_sharded_state(m) for m, _a, _k in tape):
            origin.sharded = True
            origin.note = (
                "not replayed: the model is sharded (FSDP or tensor parallel), and running its "
                "forward again on this rank alone would issue collectives the other ranks never "
                "join; its weights and the batch are finite on this rank"
            )
            # What can be read without running anything: the ops of the step's graph that
            # make NaN or Inf of ordinary values (a log of a zero).
            origin.graph_ops = _risky_nodes(state.loss_ref)
            if origin.graph_ops:
                origin.module, origin.fed_by = _risky_place(rec, state.loss_ref)
                origin.location = origin.module or origin.fed_by
            return origin
        was_on = rec.switch.on
        rec.switch.on = False  # our own hooks must not record the replay as training
        try:
            with _preserved(rec, state.rng):
                found = self._replay(tape, origin)
        except Exception as exc:  # out of memory, a model that cannot be re-run: say so
            origin.stage, origin.note = "unknown", f"replay failed: {type(exc).__name__}: {exc}"
            return origin
        finally:
            rec.switch.on = was_on
        if not found:
            origin.stage = "loss"
            origin.location = _site(state.backward_site)
            origin.loss_graph = list(node_names(state.loss_ref, 12))
        return origin

    @staticmethod
    def _forward(monitor: _Monitor, tape: list[Any], outputs: list[Any]) -> None:
        with monitor.hooks(), monitor:
            for module, args, kwargs in tape:
                # A compiled model is replayed eagerly: the checks must see every op.
                module = getattr(module, "_orig_mod", module)
                outputs.append(module(*args, **(kwargs or {})))
                if monitor.found is not None:
                    break

    def _replay(self, tape: list[Any], origin: NanOrigin) -> bool:
        rec = self.rec
        torch = rec.torch
        monitor = _Monitor(rec)
        outputs: list[Any] = []
        with contextlib.ExitStack() as precision:
            for device, dtype in rec.state.autocast:  # replay in the step's own precision
                precision.enter_context(torch.autocast(device, dtype=dtype))
            self._forward(monitor, tape, outputs)
        if monitor.found is not None:
            _set(origin, stage="forward", location=monitor.found["module"], **monitor.found)
            return True
        tensors = [t for t in _flatten(outputs) if t.requires_grad and t.is_floating_point()]
        params = [p for m, _a, _k in tape for p in m.parameters() if p.requires_grad]
        if not tensors or not params:
            return False
        node = _backward_origin(torch, tensors, params, monitor.nodes)
        if node is None:
            return False
        _set(origin, stage="backward", location=node.get("module") or node.get("site"), **node)
        return True


def _set(origin: NanOrigin, **fields: Any) -> None:
    """Fields of what a replay stage found (named as NanOrigin's)."""
    for name, value in fields.items():
        if not hasattr(origin, name):
            raise AttributeError(f"NanOrigin has no field {name!r}")
        setattr(origin, name, value)


class _Monitor:
    """Checks every torch op's outputs during the replayed forward (a TorchFunctionMode)."""

    def __init__(self, rec: Any) -> None:
        from torch.overrides import TorchFunctionMode

        self.rec = rec
        self.torch = rec.torch
        self.stack: list[str] = []
        self.found: dict[str, Any] | None = None
        self.nodes: dict[int, tuple[Any, str | None, str | None, str | None]] = {}
        monitor = self

        class Mode(TorchFunctionMode):
            def __torch_function__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                out = call_as_caller(sys._getframe(1), func, args, kwargs or {})
                monitor.after_op(func, args, kwargs or {}, out)
                return out

        self._mode = Mode()

    def __enter__(self) -> _Monitor:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        def pre(module: Any, args: Any) -> None:
            self.stack.append(self.rec.models.name_of(module))

        def post(module: Any, args: Any, out: Any) -> None:
            if self.stack:
                self.stack.pop()
            for t in _flatten([out]):
                node = t.grad_fn
                if node is not None and id(node) not in self.nodes:
                    self.nodes[id(node)] = (node, self.rec.models.name_of(module), None, None)

        handles = [
            register_module_forward_pre_hook(pre),
            register_module_forward_hook(post, always_call=True),
        ]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def after_op(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        torch = self.torch
        outs = _flatten([out])
        module = self.stack[-1] if self.stack else None
        op = _op_name(func)
        site = None
        for t in outs:
            node = t.grad_fn
            if node is not None and id(node) not in self.nodes:
                site = site or _user_site()
                self.nodes[id(node)] = (node, module, op, site)
        if self.found is not None:
            return
        bad = [t for t in outs if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if not bad:
            return
        inputs = [t for t in _flatten([args, kwargs]) if t.is_floating_point()]
        if not all(bool(torch.isfinite(t).all()) for t in inputs):
            return  # spread from an earlier op (already reported) or from the data
        t = bad[0]
        self.found = {
            "module": module or "(outside any module)",
            "op": op,
            "site": site or _user_site(),
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "nan": int(torch.isnan(t).sum()),
            "inf": int(torch.isinf(t).sum()),
            "numel": int(t.numel()),
            "inputs": [_describe(torch, x) for x in inputs[:3]],
        }


def _backward_origin(
    torch: Any, outputs: list[Any], params: list[Any], nodes: dict[int, Any]
) -> dict[str, Any] | None:
    found: dict[str, Any] = {}
    handles = []

    def check(node: Any, grad_inputs: Any, grad_outputs: Any) -> None:
        if found:
            return
        incoming = [g for g in grad_outputs if g is not None]
        produced = [g for g in grad_inputs if g is not None]
        if not all(bool(torch.isfinite(g).all()) for g in incoming):
            return
        bad = [g for g in produced if g.is_floating_point() and not bool(torch.isfinite(g).all())]
        if not bad:
            return
        _node, module, op, site = nodes.get(id(node), (node, None, None, None))
        g = bad[0]
        found.update(
            node=node.name(),
            module=module,
            op=op,
            site=site,
            shape=list(g.shape),
            nan=int(torch.isnan(g).sum()),
            inf=int(torch.isinf(g).sum()),
            numel=int(g.numel()),
        )

    seen: dict[int, Any] = {}  # the nodes themselves: an id is unique only while its object lives
    todo = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        handles.append(node.register_hook(lambda gi, go, n=node: check(n, gi, go)))
        todo.extend(n for n, _ in node.next_functions if n is not None)
    try:
        torch.autograd.grad(
            outputs,
            params,
            grad_outputs=[torch.ones_like(t) for t in outputs],
            allow_unused=True,
        )
    finally:
        for h in handles:
            h.remove()
    return found or None


@contextlib.contextmanager
def _preserved(rec: Any, rng: Any) -> Iterator[None]:
    """Replay with the step's random state; put random state and buffers back afterwards."""
    generator, state = rng if rng is not None else (rec.torch.default_generator, None)
    saved_rng = generator.get_state()
    buffers = []
    for module, _label in rec.models.roots():
        for buf in module.buffers():
            buffers.append((buf, buf.detach().clone()))
    if state is not None:
        generator.set_state(state)
    try:
        yield
    finally:
        generator.set_state(saved_rng)
        with rec.torch.no_grad():
            for buf, copy in buffers:
                buf.copy_(copy)


def _unwrapped(module: Any) -> Any:
    """The model inside a DistributedDataParallel wrapper: DDP's own forward broadcasts buffers
    and arms its gradient all-reduce, collectives a replay on one rank must never issue."""
    inner = getattr(module, "module", None)
    if inner is not None and type(module).__name__ == "DistributedDataParallel":
        return inner
    return module


def _bad_gradients(rec: Any, params: list[Any], limit: int = 5) -> list[BadGradient]:
    from torchdoctor.diagnose.nan import BadGradient

    torch = rec.torch
    out = []
    for p in params:
        g = p.grad
        if g is not None:
            g = local(g)
        if g is None or bool(torch.isfinite(g).all()):
            continue
        named = rec.models.param_name(p)
        out.append(
            BadGradient(
                param=".".join(x for x in named if x) if named else "?",
                nan=int(torch.isnan(g).sum()),
                inf=int(torch.isinf(g).sum()),
                numel=int(g.numel()),
            )
        )
        if len(out) >= limit:
            break
    return out


def _bad_weights(rec: Any) -> list[BadWeight]:
    """The parameters whose weights (this rank's shards) are not finite; without any, those
    with values over HUGE_WEIGHT, the largest first: uninitialised memory need hold no NaN to
    make one in the first forward."""
    from torchdoctor.diagnose.nan import HUGE_WEIGHT, BadWeight

    named = [
        (label, name, p)
        for module, label in rec.models.models()
        for name, p in module.named_parameters()
        if p.is_floating_point() and local(p).numel()
    ]
    nonfinite, huge = [], []
    for (label, name, p), top in zip(named, largest_values([p for *_n, p in named]), strict=True):
        if top <= HUGE_WEIGHT:
            continue
        mod_name, _p = rec.models.param_name(p) or (label, name)
        entry = BadWeight(module=mod_name, param=name, numel=int(p.numel()))
        if math.isfinite(top):
            entry.largest = top
            huge.append(entry)
        else:
            nonfinite.append(entry)
    huge.sort(key=lambda e: -(e.largest or 0.0))
    return (nonfinite or huge)[:5]


def _bad_inputs(torch: Any, tape: list[Any]) -> TensorStats | None:
    _module, args, kwargs = tape[0]
    for t in map(local, _flatten([args, kwargs])):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return _describe(torch, t)
    return None


def _describe(torch: Any, t: Any) -> TensorStats:
    from torchdoctor.diagnose.nan import TensorStats

    t = t.detach()
    finite = t[torch.isfinite(t)] if t.numel() else t
    out = TensorStats(
        shape=list(t.shape),
        dtype=str(t.dtype).removeprefix("torch."),
        nan=int(torch.isnan(t).sum()),
        inf=int(torch.isinf(t).sum()),
    )
    if finite.numel():
        out.min, out.max = float(finite.min()), float(finite.max())
        out.zeros, out.negatives = int((t == 0).sum()), int((t < 0).sum())
    return out


# Autograd nodes of ops that turn ordinary values into NaN or Inf (a log or a root of zero, a
# division by a tensor that can be zero). Not x.pow(2), softmax or a norm with its eps.
RISKY_NODES = frozenset(
    {
        "LogBackward0",
        "Log2Backward0",
        "Log10Backward0",
        "Log1PBackward0",
        "XlogyBackward0",
        "SqrtBackward0",
        "RsqrtBackward0",
        "DivBackward0",
        "ReciprocalBackward0",
    }
)


def _risky_nodes(loss: Any, limit: int = 5000) -> list[str]:
    """The names of RISKY_NODES in the graph of `loss`, nearest the loss first (at most
    `limit` nodes looked at), each once."""
    found: list[str] = []
    for name in node_names(loss, limit):
        if name in RISKY_NODES and name not in found:
            found.append(name)
    return found


def _risky_place(rec: Any, loss: Any, limit: int = 5000) -> tuple[str | None, str | None]:
    """Where the risky node nearest the loss sits, read from the parameters nearest it in the
    graph: (the module its output feeds: the first op above it, towards the loss, that uses
    weights; the module whose output it takes). Nothing is run."""
    up: dict[int, Any] = {}  # id(node) -> the node that leads to it from the loss (kept alive)
    for node, parent in walk(loss.grad_fn, limit):
        up[id(node)] = parent
        if node.name() in RISKY_NODES:
            feeds, child, above = None, node, parent
            for _ in range(8):  # through the wrappers a sharded layer adds (from_local, ...)
                if above is None or feeds is not None:
                    break
                feeds = _nearest_module(rec, above, child)
                child, above = above, up.get(id(above))
            return feeds, _nearest_module(rec, node, None)
    return None, None


def _nearest_module(rec: Any, start: Any, skip: Any, limit: int = 200) -> str | None:
    """The module of the parameter nearest `start` towards the leaves, not through `skip`."""
    for node, _parent in walk(start, limit, skip=skip):
        variable = getattr(node, "variable", None)
        named = rec.models.param_name(variable) if variable is not None else None
        if named is not None:
            return str(named[0])
    return None


def _flatten(obj: Any) -> list[Any]:
    out = []
    todo = [obj]
    while todo:
        item = todo.pop()
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, (list, tuple)):
            todo.extend(reversed(item))
        elif isinstance(item, dict):
            todo.extend(reversed(list(item.values())))
    return out


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or str(func)
    qual = getattr(func, "__qualname__", name)
    if qual.startswith(("TensorBase.", "Tensor.")):
        return f"Tensor.{name}"
    module = getattr(func, "__module__", "") or ""
    if "functional" in module:
        return f"F.{name}"
    return f"torch.{name}"


def _user_site() -> str | None:
    """file:line of the innermost frame of the user's code (the op's call site)."""
    return site(user_frame(sys._getframe(2)))


def _site(site: tuple[str, int] | None) -> str | None:
    return f"{site[0]}:{site[1]}" if site else None
