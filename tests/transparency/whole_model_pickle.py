"""The whole model pickled: torch.save(model) and pickle.dumps(model) after training (as the
word_language_model example and many notebooks save), loaded back and used."""

import io
import pickle

import torch
from common import seed, show
from torch import nn


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh())
        self.out = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(x))


def main() -> None:
    seed()
    model = Head()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    for step in range(10):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        show(f"step {step} loss", loss.item())
    torch.save(model, "whole.pt")
    torch.save({"model": model, "optimizer": optimizer.state_dict()}, "bundle.pt")
    raw = pickle.dumps(model)  # not written out: plain pickles of tensors embed addresses
    print("pickle size", len(raw))
    loaded = torch.load("whole.pt", weights_only=False)
    again = pickle.loads(raw)
    print("pickle mentions torchdoctor", b"torchdoctor" in raw)
    print("loaded hooks", len(loaded._forward_pre_hooks), len(again._forward_pre_hooks))
    print("loaded forward hooks", len(loaded._forward_hooks), len(again._forward_hooks))
    print("always called", len(loaded._forward_hooks_always_called))
    show("loaded output", loaded(x).sum().item())
    show("unpickled output", again(x).sum().item())
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    print("state dict keys", sorted(model.state_dict()))


if __name__ == "__main__":
    main()
