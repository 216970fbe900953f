"""A tiny Lightning module fitted with TorchdoctorCallback and a CSVLogger. --lr 1e4 plants a
learning rate so high that the loss overflows within a few steps. Prints one JSON line: what the
Trainer, the callback and the module itself saw (the module's own gradient norm per update)."""

import argparse
import json

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from torchdoctor.integrations.lightning import TorchdoctorCallback

parser = argparse.ArgumentParser()
parser.add_argument("--root", required=True)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--accum", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        self.grad_norms: list[float] = []

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad.flatten() for p in self.parameters() if p.grad is not None]
        self.grad_norms.append(float(torch.cat(grads).norm()))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=args.lr)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.randn(256, 1) * 10)
loader = torch.utils.data.DataLoader(data, batch_size=16)
callback = TorchdoctorCallback()
module = Regressor()
trainer = pl.Trainer(
    max_steps=args.steps,
    accumulate_grad_batches=args.accum,
    accelerator="cpu",
    default_root_dir=args.root,
    logger=CSVLogger(args.root),
    log_every_n_steps=1,
    enable_progress_bar=False,
    enable_checkpointing=False,
    enable_model_summary=False,
    callbacks=[callback],
)
trainer.fit(module, loader)
print(
    json.dumps(
        {
            "global_step": trainer.global_step,
            "log_dir": trainer.log_dir,
            "run_dir": str(callback.run_dir or ""),
            "report": str(callback.report_path or ""),
            "grad_norms": module.grad_norms,
        }
    )
)
