"""LBFGS with a closure that the optimizer calls several times per step, on a small LSTMCell
sequence model in double precision (the pattern of pytorch/examples time_sequence_prediction)."""

import torch
from common import seed, show
from torch import nn


class Sequence(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(1, 12)
        self.linear = nn.Linear(12, 1)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(inputs.size(0), 12, dtype=torch.double)
        c = torch.zeros(inputs.size(0), 12, dtype=torch.double)
        outputs = []
        for x in inputs.split(1, dim=1):
            h, c = self.cell(x, (h, c))
            outputs.append(self.linear(h))
        return torch.cat(outputs, dim=1)


def main() -> None:
    seed()
    t = torch.arange(0, 40, dtype=torch.double)
    waves = torch.sin(t.unsqueeze(0) / 4.0 + torch.rand(6, 1, dtype=torch.double) * 6)
    inputs, target = waves[:, :-1], waves[:, 1:]
    model = Sequence().double()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.8, max_iter=5)
    for step in range(4):

        def closure(step: int = step) -> torch.Tensor:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), target)
            show(f"step {step} closure loss", loss.item())
            loss.backward()
            return loss

        show(f"step {step} returned", optimizer.step(closure).item())


if __name__ == "__main__":
    main()
