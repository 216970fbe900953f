"""A walk over an autograd graph from a root node towards the leaves, each node once.

torch can hand out a new Python object for a node on every access of its edges (2.11 does on
CUDA), and an `id()` is unique only while its object lives: a walk that kept ids alone met a
dropped node's id again on a new node and stopped short (three nodes below the loss, which
then "reached no parameter"). This walk keeps every node it has seen until it ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any


def walk(
    root: Any, limit: int, *, depth_first: bool = False, skip: Any = None
) -> Iterator[tuple[Any, Any]]:
    """(node, the node that leads to it) from `root`, breadth first (or depth first), at most
    `limit` nodes (`skip` counted among them), never into or through `skip`."""
    seen: dict[int, Any] = {} if skip is None else {id(skip): skip}  # the nodes themselves
    todo: deque[tuple[Any, Any]] = deque([(root, None)])
    take = todo.pop if depth_first else todo.popleft
    while todo and len(seen) < limit:
        node, parent = take()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        yield node, parent
        todo.extend((n, node) for n, _ in node.next_functions)


def node_names(loss: Any, limit: int) -> Iterator[str]:
    """The names of the autograd nodes of `loss`'s graph (a tensor, or anything else: none),
    breadth first from the loss, each node once, at most `limit`. Host-side only: it reads no
    value, so it works in a GPU context an error broke."""
    return (node.name() for node, _up in walk(getattr(loss, "grad_fn", None), limit))


def edges(loss: Any, limit: int) -> list[tuple[str, str]]:
    """(node, the node it takes its input from) by name, for the first `limit` nodes of
    `loss`'s graph, breadth first: which op fed which (host-side only, as node_names)."""
    return [
        (up.name(), node.name())
        for node, up in walk(getattr(loss, "grad_fn", None), limit)
        if up is not None
    ]
