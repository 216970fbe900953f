"""Which tensors and modules are sharded across ranks: torch's DTensor class and FSDP2's
module class, looked up in `sys.modules` only.

Nothing can be a DTensor until `torch.distributed.tensor` is imported, nor an FSDP2 unit
until `torch.distributed.fsdp` is: looking them up imports nothing, so a script that never
shards pays one dictionary look-up. Telemetry (`telemetry/local_shards.py`) and the memory
census (`memory/census.py`) both ask here.
"""

from __future__ import annotations

import sys
from typing import Any


def dtensor_class() -> Any:
    """`torch.distributed.tensor.DTensor`, or None before it is imported."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def fsdp_module_class() -> Any:
    """`torch.distributed.fsdp.FSDPModule` (what `fully_shard` makes a module), or None."""
    module = sys.modules.get("torch.distributed.fsdp")
    return getattr(module, "FSDPModule", None) if module is not None else None
