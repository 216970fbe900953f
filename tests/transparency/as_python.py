"""Run as python runs a script: the names a script sees about itself (run from a path
relative to the working directory), then an error raised inside backward(), uncaught: its
traceback must be the plain run's, byte for byte (no frame of a wrapper around backward)."""

import os
import sys

import torch
from torch import nn


def main() -> None:
    print("__file__ absolute:", os.path.isabs(__file__), os.path.basename(__file__))
    print("argv[0]:", sys.argv[0])
    print("sys.path[0] is the script's directory:", sys.path[0] == os.path.dirname(__file__))
    print("loader:", type(__loader__).__name__, __loader__.name, __loader__.path == __file__)
    print("spec, cached, package:", __spec__, __cached__, __package__)
    print("globals:", [k for k in globals() if k.startswith("__")])
    print("siblings found:", "common.py" in os.listdir(os.path.dirname(__file__)))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out = model(torch.randn(8, 4))
    out.backward()  # not a scalar: raises inside torch.autograd.backward


if __name__ == "__main__":
    main()
