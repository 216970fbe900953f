"""A small, real training loop that runs until told to stop.

It names its objects the way the playbook commands of tests/integration/test_seed_commands.py
expect (model, optimizer,
train_loader, trainer.current_step, trainer.grad_clip), so those commands run verbatim.
"""

import argparse
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=1_000_000)
parser.add_argument("--stop-file", default="stop", help="stop once this file exists")
parser.add_argument("--pause", type=float, default=0.002, help="seconds of extra work per step")
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--start", action="store_true", help="call torchdoctor.start() itself")
parser.add_argument("--threads", type=int, default=0, help="extra idle threads to start")
args = parser.parse_args()

if args.start:
    import torchdoctor

    torchdoctor.start()

import threading  # noqa: E402

idle = threading.Event()
for i in range(args.threads):
    threading.Thread(target=idle.wait, name=f"idle-{i}", daemon=True).start()


class Trainer:
    def __init__(self) -> None:
        self.current_step = 0
        self.grad_clip = 1.0


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
inputs = torch.randn(512, 16)
# Labels the model can learn (the largest of the first four inputs): a healthy run, its loss
# clearly falling, so no test that questions it meets a true `not_learning` by chance.
dataset = TensorDataset(inputs, inputs[:, :4].argmax(dim=1))
train_loader = DataLoader(dataset, batch_size=32, shuffle=True)
trainer = Trainer()

print(f"argv={sys.argv[1:]}", flush=True)
done = False
while not done:
    for x, y in train_loader:
        optimizer.zero_grad(set_to_none=False)  # grads stay tensors: eval can read them any time
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.grad_clip)
        optimizer.step()
        trainer.current_step += 1
        print(f"step {trainer.current_step} loss {loss.item():.6f}", flush=True)
        if args.pause:
            time.sleep(args.pause)
        if trainer.current_step >= args.steps or (
            args.stop_file and os.path.exists(args.stop_file)
        ):
            done = True
            break
print("finished", flush=True)
sys.exit(args.exit_code)
