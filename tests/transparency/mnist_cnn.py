"""A small CNN classifier in the style of pytorch/examples mnist: DataLoader, Adadelta, StepLR,
log_softmax + nll_loss, an evaluation pass, the state dict saved at the end."""

import torch
import torch.nn.functional as F
from common import seed, show
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(16 * 5 * 5, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout(torch.flatten(x, 1))
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def main() -> None:
    seed()
    images = torch.randn(256, 1, 14, 14)
    labels = torch.randint(0, 10, (256,))
    train = DataLoader(TensorDataset(images[:192], labels[:192]), batch_size=32, shuffle=True)
    test = DataLoader(TensorDataset(images[192:], labels[192:]), batch_size=64)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(2):
        model.train()
        for data, target in train:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            show(f"epoch {epoch} loss", loss.item())
        model.eval()
        correct = 0
        with torch.no_grad():
            for data, target in test:
                correct += int(model(data).argmax(dim=1).eq(target).sum())
        print(f"epoch {epoch} correct {correct}")
        scheduler.step()
    torch.save(model.state_dict(), "mnist_cnn.pt")


if __name__ == "__main__":
    main()
