"""A DCGAN-style loop that is right, and that each silent-error check must leave alone: two
optimizers (the discriminator's steps first), the discriminator trained on a detached fake
batch, the generator's backward() running through the discriminator (whose gradients are
cleared at the start of its next step), batch norm in both. --detached-generator plants the bug:
the generator's loss on fake.detach(), so optimizerG steps with no gradient at all (--fixed:
its twin)."""

import sys

import torch
from torch import nn

torch.manual_seed(0)
Z, D = 8, 16
netG = nn.Sequential(nn.Linear(Z, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, D))
netD = nn.Sequential(nn.Linear(D, 32), nn.LeakyReLU(0.2), nn.Dropout(0.2), nn.Linear(32, 1))
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
criterion = nn.BCEWithLogitsLoss()
data = torch.utils.data.TensorDataset(torch.randn(1024, D) * 0.5 + 1.0)
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
for (real,) in loader:
    b = real.size(0)
    # (1) the discriminator: real batch, then a fake batch it must not backpropagate into G
    netD.zero_grad()
    errD_real = criterion(netD(real), torch.ones(b, 1))
    errD_real.backward()
    fake = netG(torch.randn(b, Z))
    errD_fake = criterion(netD(fake.detach()), torch.zeros(b, 1))
    errD_fake.backward()
    optimizerD.step()
    # (2) the generator, through the discriminator
    netG.zero_grad()
    bug = "--detached-generator" in sys.argv and "--fixed" not in sys.argv
    seen = fake.detach() if bug else fake
    errG = criterion(netD(seen), torch.ones(b, 1))
    errG.backward()
    optimizerG.step()
