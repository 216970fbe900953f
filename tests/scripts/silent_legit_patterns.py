"""Training patterns that are right and look odd, which the silent-error checks must leave
alone: a frozen backbone (requires_grad=False, still handed to the optimizer) under a
trainable head; an evaluation pass under no_grad and eval() between epochs, then train()
again; a parameter group kept at lr 0 on purpose; ConstantLR, then a constant rate; a
ReduceLROnPlateau stepped on the validation loss; dropout and batch norm in training mode."""

import torch
from torch import nn

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.neck = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Dropout(0.2))
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.neck(self.backbone(x)))


model = Net()
for p in model.backbone.parameters():
    p.requires_grad_(False)
optimizer = torch.optim.SGD(
    [
        {"params": model.neck.parameters(), "lr": 0.0},  # kept as it is, for now
        {"params": model.head.parameters()},
        {"params": model.backbone.parameters()},
    ],
    lr=0.05,
    momentum=0.9,
)
constant = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=0.5, total_iters=2)
plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=1)
train = torch.utils.data.TensorDataset(torch.randn(320, 12), torch.randint(0, 3, (320,)))
val = torch.utils.data.TensorDataset(torch.randn(64, 12), torch.randint(0, 3, (64,)))
train_loader = torch.utils.data.DataLoader(train, batch_size=16, shuffle=True)
val_loader = torch.utils.data.DataLoader(val, batch_size=32)
for _epoch in range(4):
    model.train()
    for x, y in train_loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    constant.step()
    model.eval()
    with torch.no_grad():
        val_loss = sum(nn.functional.cross_entropy(model(x), y).item() for x, y in val_loader)
    plateau.step(val_loss)
