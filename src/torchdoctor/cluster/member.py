"""This process as a rank of a job, once torch.distributed is initialised (before that, it is
not yet a member of anything it could publish itself in): the rank identity the session knows
(torchdoctor.identity), or the one torch.distributed tells."""

from __future__ import annotations

import os
import sys

from torchdoctor.identity import RankIdentity, from_process_group


def this_member(known: RankIdentity | None) -> RankIdentity | None:
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
    if known is not None and (known.rank, known.world_size) == (rank, world):
        return known
    return from_process_group(rank, world)


def node_rank() -> str | None:
    """torchrun's node rank (GROUP_RANK): tells the nodes of one job apart, even on one host."""
    value = os.environ.get("GROUP_RANK", "")
    return value if value.isdigit() else None
