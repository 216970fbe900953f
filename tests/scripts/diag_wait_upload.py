"""After each epoch the loop waits for a checkpoint upload thread to say it is done; the
thread crashed on its first upload, so the wait never ends (in the main thread).
--fixed waits with a timeout and carries on."""

import sys
import threading

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
uploaded = threading.Event()


def upload(state: dict) -> None:
    raise ConnectionError("bucket not reachable")  # the thread dies; nobody sets `uploaded`


threading.excepthook = lambda args: None  # the crash goes unnoticed, as it often does
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _epoch in range(3):
    for _step in range(10):
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    threading.Thread(target=upload, args=(model.state_dict(),)).start()
    if FIXED:
        uploaded.wait(timeout=0.1)
    else:
        uploaded.wait()
    uploaded.clear()
