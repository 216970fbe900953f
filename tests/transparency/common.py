"""Shared by the transparency scripts: deterministic set-up and full-precision printing."""

import os
import random

import numpy as np
import torch


def seed(value: int = 0) -> None:
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    torch.set_num_threads(1)


def show(tag: str, value: float) -> None:
    """Print a number so that any difference in its bits shows."""
    print(f"{tag} {float(value).hex()}", flush=True)


def params_digest(model: torch.nn.Module) -> str:
    """The weights' exact bits, summarised."""
    total = 0.0
    for p in model.parameters():
        total += float(p.detach().double().abs().sum())
    return float(total).hex()


def out_dir() -> str:
    path = os.environ.get("OUT_DIR", ".")
    os.makedirs(path, exist_ok=True)
    return path
