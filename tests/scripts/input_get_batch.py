"""A nanoGPT-shaped loop: the model computes its own loss, the next batch is fetched from a
memory-mapped token file by `get_batch` between the forward pass and backward(), and the fetch
is slow (a cold disk: --delay seconds a batch). No DataLoader. Prints one JSON line: the
seconds the loop itself spent in the model's call and in get_batch, step by step.
--metrics-delay S: after each update the loop also calls log_metrics(), which takes S seconds
(work of the loop's own that is not its input)."""

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--delay", type=float, default=0.008)
parser.add_argument("--metrics-delay", type=float, default=0.0)
args = parser.parse_args()

VOCAB, BLOCK, BATCH = 64, 16, 8
torch.manual_seed(0)
path = os.path.join(tempfile.mkdtemp(), "train.bin")
(np.arange(20_000) * 7 % VOCAB).astype(np.uint16).tofile(path)  # a text it can learn


def get_batch():
    data = np.memmap(path, dtype=np.uint16, mode="r")  # as nanoGPT: reopened every batch
    ix = torch.randint(len(data) - BLOCK, (BATCH,))
    x = torch.stack([torch.from_numpy(data[i : i + BLOCK].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + BLOCK].astype(np.int64)) for i in ix])
    time.sleep(args.delay)  # the read a page cache miss costs
    return x, y


def log_metrics(loss):
    time.sleep(args.metrics_delay)  # a metrics server's round trip
    return float(loss)


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, 32)
        self.h = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 32))
        self.lm_head = nn.Linear(32, VOCAB)

    def forward(self, idx, targets):
        logits = self.lm_head(self.h(self.wte(idx)))
        loss = nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
        return logits, loss


model = TinyGPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
fetch, calls = [], []
X, Y = get_batch()
for _ in range(args.steps):
    t0 = time.perf_counter()
    logits, loss = model(X, Y)
    calls.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    X, Y = get_batch()  # the next batch, fetched while nothing else runs
    fetch.append(time.perf_counter() - t0)
    loss.backward()
    optimizer.step()
    if args.metrics_delay:
        log_metrics(loss)
    optimizer.zero_grad(set_to_none=True)
print(json.dumps({"model": calls, "fetch": fetch}))
