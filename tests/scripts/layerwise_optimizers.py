"""Training in phases, each with an optimizer of its own, as pytorch/examples'
mnist_forward_forward trains its layers: the first layer for STEPS updates with its Adam,
then the second with another. The first phase's optimizer never steps again; the second
phase must be steps too. With EPOCHS (k-fold cross-validation, as Lightning Fabric's kfold_cv
example): a model with dropout and an optimizer per fold, every fold trained STEPS updates in
turn, then validated in eval mode and left so while the next folds train, then again each
epoch: an earlier fold's optimizer comes back.

    python layerwise_optimizers.py [STEPS [EPOCHS FOLDS]]
"""

import sys

import torch
from torch import nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
torch.manual_seed(0)
if len(sys.argv) > 3:  # k-fold
    epochs, folds = int(sys.argv[2]), int(sys.argv[3])
    models = [
        nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.1), nn.Linear(16, 1)) for _ in range(folds)
    ]
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-2) for m in models]
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    for epoch in range(epochs):
        for fold, (model, opt) in enumerate(zip(models, optimizers, strict=True)):
            model.train()
            for _ in range(steps):
                loss = (model(x) - y).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            model.eval()  # validated, then left in eval mode while the next folds train
            with torch.no_grad():
                held_out = (model(x) - y).pow(2).mean()
            print(f"epoch {epoch} fold {fold}: loss {loss.item():.4f} held out {held_out:.4f}")
    sys.exit(0)
layers = [nn.Linear(16, 16), nn.Linear(16, 16)]
optimizers = [torch.optim.Adam(layer.parameters(), lr=1e-2) for layer in layers]
x = torch.randn(64, 16)
for layer, opt in zip(layers, optimizers, strict=True):
    for _ in range(steps):
        loss = layer(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    x = layer(x).detach()
    print(f"phase done: loss {loss.item():.4f}")
