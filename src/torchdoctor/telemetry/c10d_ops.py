"""The c10d ops that python.collectives records, how to read their arguments, and the facts
of a process group: shared by the Python kernel (telemetry/collectives.py) and the C++ one
(telemetry/collectives_native.py), so that both write the same rows."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str  # the op as the table names it
    inputs: int | None  # argument holding the tensors this rank contributes
    group: int  # argument holding the process group
    peer: int | None = None  # send/recv: the other rank; broadcast, reduce...: the root
    p2p: bool = False
    gathers: bool = False  # its output is the group's size times its input


# c10d op -> how to read its arguments (schemas: torch.ops.c10d.<op>.default._schema)
OPS: dict[str, OpSpec] = {
    "allreduce_": OpSpec("all_reduce", 0, 1),
    "allreduce_coalesced_": OpSpec("all_reduce_coalesced", 0, 1),
    "broadcast_": OpSpec("broadcast", 0, 1, peer=2),
    "reduce_": OpSpec("reduce", 0, 1, peer=3),
    "allgather_": OpSpec("all_gather", 1, 2, gathers=True),
    "_allgather_base_": OpSpec("all_gather_into_tensor", 1, 2, gathers=True),
    "allgather_coalesced_": OpSpec("all_gather_coalesced", 1, 2, gathers=True),
    "allgather_into_tensor_coalesced_": OpSpec(
        "all_gather_into_tensor_coalesced", 1, 2, gathers=True
    ),
    "reduce_scatter_": OpSpec("reduce_scatter", 1, 2),
    "_reduce_scatter_base_": OpSpec("reduce_scatter_tensor", 1, 2),
    "reduce_scatter_tensor_coalesced_": OpSpec("reduce_scatter_tensor_coalesced", 1, 2),
    "gather_": OpSpec("gather", 1, 2, peer=3, gathers=True),
    "scatter_": OpSpec("scatter", 1, 2, peer=3),
    "alltoall_": OpSpec("all_to_all", 1, 2),
    "alltoall_base_": OpSpec("all_to_all_single", 1, 2),
    "barrier": OpSpec("barrier", None, 1),
    "monitored_barrier_": OpSpec("monitored_barrier", None, 1),
    "send": OpSpec("send", 0, 1, peer=2, p2p=True),
    "recv_": OpSpec("recv", 0, 1, peer=2, p2p=True),
    "recv_any_source_": OpSpec("recv", 0, 1, p2p=True),
}


def group_facts(pg: Any) -> tuple[str, list[int], int]:
    """A group's label ('default', or "<name> [global ranks]"), the global rank of each of its
    ranks, and the group's own count of calls so far (a probe started late still lines up)."""
    dist = torch.distributed
    try:
        ranks = [int(r) for r in dist.get_process_group_ranks(pg)]
    except Exception:
        ranks = list(range(pg.size()))
    try:
        world = dist.distributed_c10d._world.default_pg
    except Exception:
        world = None
    if pg is world:
        label = "default"
    else:
        desc = getattr(pg, "group_desc", "") or ""
        name = desc if desc and desc != "undefined" else str(getattr(pg, "group_name", "?"))
        label = f"{name} [{','.join(map(str, ranks))}]"
    try:
        start = int(pg._get_sequence_number_for_group())
    except Exception:
        start = 0
    return label, ranks, start
