"""This process as a rank of a job: rank, local rank, world size, node, job, read once
torch.distributed is initialised (before that, a process is not yet a member of anything)."""

from __future__ import annotations

import dataclasses
import os
import sys


@dataclasses.dataclass(frozen=True)
class Member:
    rank: int
    local_rank: int
    world_size: int
    node: str  # torchrun's node rank (GROUP_RANK), else the host name
    job: str | None  # torchrun's run id, when there is one


def this_member() -> Member | None:
    """None until init_process_group has run (or when torch was never imported)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        rank, world = int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # the default group is being destroyed
        return None
    local = os.environ.get("LOCAL_RANK", "")
    node = os.environ.get("GROUP_RANK") or os.uname().nodename
    return Member(
        rank=rank,
        local_rank=int(local) if local.isdigit() else rank,
        world_size=world,
        node=str(node),
        job=os.environ.get("TORCHELASTIC_RUN_ID"),
    )
