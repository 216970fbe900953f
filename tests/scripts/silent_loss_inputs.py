"""Losses whose inputs do not line up with what they expect, one per --problem:
  log_softmax_axis      log_softmax over the batch axis (dim=0) before nll_loss
  nll_on_probabilities  softmax (not log_softmax) before nll_loss
  nll_on_masked_probabilities
                        the same, with the rows to learn from picked by a mask in between
                        (a graph network's `output[train_mask]`, pytorch/examples' GAT)
  softmax_before_ce     softmax before cross_entropy (softmax twice)
  sigmoid_before_bce_with_logits
                        a sigmoid output given to binary_cross_entropy_with_logits (sigmoid
                        twice), squeezed to [N] first as pytorch/examples' siamese network does
  class_axis            [N, T, C] logits with [N, T, C] class probabilities: classes on the
                        last axis, where cross_entropy reads them on axis 1
  flatten_order         a time-major RNN's [T, N, C] logits flattened against [N, T] targets
  broadcast             mse_loss of a [N, 1] prediction against [N] targets
  single_class          cross_entropy on a one-output model against [N, 1] values in [0, 1)
                        (pytorch/examples' DDP tutorial): log_softmax of one class is 0
--fixed writes each one right."""

import sys
import warnings

import torch
from torch import nn

F = nn.functional
FIXED = "--fixed" in sys.argv
PROBLEM = sys.argv[sys.argv.index("--problem") + 1]
warnings.filterwarnings("ignore", message="Using a target size")
torch.manual_seed(0)
N, T, C, D = 8, 5, 4, 6


class Tagger(nn.Module):
    """A time-major RNN tagger: [T, N, D] in, [T, N, C] out."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(D, 16)
        self.out = nn.Linear(16, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(x)[0])


model = Tagger() if PROBLEM in ("flatten_order", "class_axis") else nn.Linear(D, C)
if PROBLEM in ("broadcast", "single_class"):
    model = nn.Linear(D, 1)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


def loss_of(x: torch.Tensor) -> torch.Tensor:
    if PROBLEM == "log_softmax_axis":
        y = torch.randint(0, C, (N,))
        return F.nll_loss(F.log_softmax(model(x), dim=1 if FIXED else 0), y)
    if PROBLEM == "nll_on_probabilities":
        y = torch.randint(0, C, (N,))
        probs = F.log_softmax(model(x), dim=1) if FIXED else F.softmax(model(x), dim=1)
        return F.nll_loss(probs, y)
    if PROBLEM == "nll_on_masked_probabilities":
        y = torch.randint(0, C, (N,))
        out = F.log_softmax(model(x), dim=1) if FIXED else F.softmax(model(x), dim=1)
        train = torch.arange(N) % 2 == 0
        return F.nll_loss(out[train], y[train])
    if PROBLEM == "sigmoid_before_bce_with_logits":
        y = (torch.rand(N) > 0.5).float()
        out = model(x)[:, 0] if FIXED else torch.sigmoid(model(x))[:, 0]
        return F.binary_cross_entropy_with_logits(out, y)
    if PROBLEM == "softmax_before_ce":
        y = torch.randint(0, C, (N,))
        logits = model(x)
        return F.cross_entropy(logits if FIXED else F.softmax(logits, dim=1), y)
    if PROBLEM == "class_axis":
        logits = model(x.transpose(0, 1)).transpose(0, 1)  # [N, T, C]
        soft = F.softmax(torch.randn(N, T, C), dim=-1)
        if FIXED:
            return F.cross_entropy(logits.transpose(1, 2), soft.transpose(1, 2))
        return F.cross_entropy(logits, soft)
    if PROBLEM == "flatten_order":
        tags = torch.randint(0, C, (N, T))  # batch-major labels
        logits = model(x.transpose(0, 1))  # [T, N, C]
        targets = tags.t().reshape(-1) if FIXED else tags.reshape(-1)
        return F.cross_entropy(logits.reshape(-1, C), targets)
    if PROBLEM == "single_class":
        values = torch.rand(N, 1)
        return (F.mse_loss if FIXED else F.cross_entropy)(model(x), values)
    y = torch.randn(N)
    pred = model(x)
    return F.mse_loss(pred.squeeze(-1) if FIXED else pred, y)


for _step in range(20):
    x = torch.randn(N, T, D) if PROBLEM in ("flatten_order", "class_axis") else torch.randn(N, D)
    loss = loss_of(x)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
