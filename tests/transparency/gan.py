"""A GAN with two optimizers stepping in turn (the pattern of pytorch/examples dcgan):
the discriminator on real and fake batches, then the generator through the discriminator."""

import torch
from common import seed, show
from torch import nn


def main() -> None:
    seed()
    netG = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh())
    netD = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid())
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real_data = torch.randn(64, 16).tanh()
    for i in range(8):
        real = real_data[torch.randint(0, 64, (16,))]
        netD.zero_grad()
        errD_real = criterion(netD(real), torch.ones(16, 1))
        errD_real.backward()
        fake = netG(torch.randn(16, 8))
        errD_fake = criterion(netD(fake.detach()), torch.zeros(16, 1))
        errD_fake.backward()
        optimizerD.step()
        netG.zero_grad()
        errG = criterion(netD(fake), torch.ones(16, 1))
        errG.backward()
        optimizerG.step()
        show(f"iter {i} D", (errD_real + errD_fake).item())
        show(f"iter {i} G", errG.item())


if __name__ == "__main__":
    main()
