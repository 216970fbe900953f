"""Writes the CUDA-saved checkpoint fixtures (tests/fixtures/ckpt/cuda_saved*.pt) on a machine
with a GPU: a small model trained one step on cuda:0, saved as a training checkpoint, in the
zip format (the default) or with --legacy in the format of torch < 1.6.

    python tests/scripts/make_cuda_checkpoint.py OUT.pt [--legacy]
"""

from __future__ import annotations

import sys

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loss = model(torch.randn(2, 4, device="cuda")).sum()
loss.backward()
optimizer.step()
torch.save(
    {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3},
    sys.argv[1],
    _use_new_zipfile_serialization="--legacy" not in sys.argv,
)
print(torch.__version__, torch.cuda.get_device_name(0))
