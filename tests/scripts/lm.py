"""A small transformer language model trained on a synthetic corpus, read through a
DataLoader with worker processes; optional gradient accumulation and GradScaler."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--accum", type=int, default=1)
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--scaler", action="store_true")
parser.add_argument("--spawn", action="store_true", help="workers started fresh, not forked")
args = parser.parse_args()
torch.manual_seed(0)


class Corpus(Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int) -> torch.Tensor:
        start = (i * 7919) % 256
        return (start + torch.arange(33) * 3) % 256  # sequences with a pattern to learn


class LM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 256)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def main() -> None:
    model = LM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0) if args.scaler else None
    context = "spawn" if args.spawn else None
    loader = DataLoader(
        Corpus(),
        batch_size=8,
        num_workers=args.workers,
        shuffle=True,
        multiprocessing_context=context,
    )
    step = 0
    for micro, batch in enumerate(loader):
        logits = model(batch[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
        scaled = loss / args.accum
        if scaler is not None:
            scaler.scale(scaled).backward()
        else:
            scaled.backward()
        print(f"micro {micro} loss {scaled.item():.8f}", flush=True)
        if (micro + 1) % args.accum == 0:
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == args.steps:
                break


if __name__ == "__main__":  # spawned DataLoader workers import this file again
    main()
