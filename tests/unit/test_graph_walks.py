"""The autograd graph walks see every node even where torch hands out a new Python object for a
node on every access (torch 2.11 on CUDA did): a walk that remembered only ids met a dropped
node's id again on the next new object and stopped three nodes below the loss, and the
silent checks then said a healthy loss reached no parameter (`detached_loss`)."""

from __future__ import annotations

from typing import Any

import torch

import torchdoctor.telemetry.recorder  # noqa: F401  (the package's own import order)
from torchdoctor.telemetry.graph_walk import edges, node_names, walk
from torchdoctor.telemetry.silent import loss_graph


class _Spec:
    def __init__(self, name: str, children: tuple[Any, ...] = (), variable: Any = None) -> None:
        self.kind, self.children, self.variable = name, children, variable


class _Fresh:
    """A graph node as that torch hands it out: a new object on every access of its edges."""

    def __init__(self, spec: _Spec) -> None:
        self.spec = spec
        if spec.variable is not None:
            self.variable = spec.variable

    def name(self) -> str:
        return self.spec.kind

    @property
    def next_functions(self) -> tuple[tuple[Any, int], ...]:
        return tuple((_Fresh(c), 0) for c in self.spec.children)


def _graph(weight: torch.nn.Parameter) -> _Fresh:
    """cross_entropy(head(x).view(-1, C)): the loss graph that was cut on the GPU."""
    leaf = _Spec("AccumulateGrad", variable=weight)
    linear = _Spec("ViewBackward0", (_Spec("AddmmBackward0", (_Spec("TBackward0", (leaf,)),)),))
    view = _Spec("ViewBackward0", (linear,))
    return _Fresh(_Spec("NllLossBackward0", (_Spec("LogSoftmaxBackward0", (view,)),)))


NAMES = [
    "NllLossBackward0",
    "LogSoftmaxBackward0",
    "ViewBackward0",
    "ViewBackward0",
    "AddmmBackward0",
    "TBackward0",
    "AccumulateGrad",
]


def test_walks_reach_the_parameters_through_fresh_node_objects() -> None:
    weight = torch.nn.Parameter(torch.zeros(2))
    root = _graph(weight)
    assert [n.name() for n, _up in walk(root, 100, depth_first=True)] == NAMES
    assert [n.name() for n, _up in walk(root, 100)] == NAMES
    assert loss_graph._reaches(root, {id(weight)}, torch.nn.Parameter) == (True, [])
    loss = type("Loss", (), {"grad_fn": root})()
    assert list(node_names(loss, 100)) == NAMES
    # which op fed which: each node after the first, with the node that takes its output
    assert [e[1] for e in edges(loss, 100)] == NAMES[1:]


def test_a_graph_without_any_leaf_is_unknown_not_detached() -> None:
    # Nothing that requires grad at its bottom: a cut we cannot read, not a detached loss.
    root = _Fresh(_Spec("MulBackward0", (_Spec("CustomBackward", ()),)))
    assert loss_graph._reaches(root, {1}, torch.nn.Parameter) == (None, [])
