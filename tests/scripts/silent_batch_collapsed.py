"""A next-token model whose collate function joins the batch's token lists into one sequence
(a processor that merged the batch, as in TrainCheck's transformers-34204): the DataLoader
asks for 16 samples, the model gets one row. --fixed stacks the samples."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
torch.manual_seed(0)
VOCAB, LENGTH = 50, 12
texts = [torch.randint(0, VOCAB, (LENGTH,)) for _ in range(400)]


def collate(batch: list[torch.Tensor]) -> torch.Tensor:
    if FIXED:
        return torch.stack(batch)
    return torch.cat(batch).unsqueeze(0)  # [1, 16 * LENGTH]: one long "sample"


model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, VOCAB))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = torch.utils.data.DataLoader(texts, batch_size=16, shuffle=True, collate_fn=collate)
for tokens in loader:
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
