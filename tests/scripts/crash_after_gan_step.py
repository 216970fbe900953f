"""A GAN's loop that crashes after its updates, outside every module and every backward: an
image saver handed a tensor that still requires grad (dcgan's save_image met a GPU tensor the
same way). The generator's backward runs after the primary optimizer's step, so a traced step
has a module backward in progress when the error comes: the error is not that module's."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, a: int, b: int) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(a, 8), nn.ReLU(), nn.Linear(8, b))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x)


def save_image(t: torch.Tensor) -> bytes:
    return t.clamp(0, 1).numpy().tobytes()


torch.manual_seed(0)
netG, netD = Net(4, 4), Net(4, 1)
optD = torch.optim.SGD(netD.parameters(), lr=0.1)
optG = torch.optim.SGD(netG.parameters(), lr=0.1)
for i in range(3):
    fake = netG(torch.randn(2, 4))
    netD.zero_grad()
    errD = netD(fake.detach()).mean() - netD(torch.randn(2, 4)).mean()
    errD.backward()
    optD.step()
    netG.zero_grad()
    errG = -netD(fake).mean()
    errG.backward()
    optG.step()
    if i == 1:
        save_image(fake)
