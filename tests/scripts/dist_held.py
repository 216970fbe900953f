"""A 1-rank gloo group that all-reduces fresh 16 MiB tensors and drops each one at once (as
ZeRO-3 drops a gathered layer): prints how many of them are still alive after each call, the
most at the end. Without torchdoctor none is; under it, only those its works still hold."""

from __future__ import annotations

import socket
import sys
import weakref

import torch
import torch.distributed as dist

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
alive: list[weakref.ref] = []
most = 0
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 40):
    t = torch.ones(4 << 20)  # 16 MiB of float32
    dist.all_reduce(t, async_op=True).wait()
    alive.append(weakref.ref(t))
    del t  # nothing else refers to it: freed now, unless a work holds it
    most = max(most, sum(r() is not None for r in alive))
print(f"most alive {most}")
dist.destroy_process_group()
