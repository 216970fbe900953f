"""Initialisations that are not repeated work, and the wrappers of torch.nn.init unseen:
nanoGPT's pattern (apply(_init_weights), then every c_proj.weight initialised again with a
normal scaled by depth, from another line), a layer's own reset_parameters() run by its
constructor, `.data` initialised, a weight tied between two modules (reached twice by one
line in one pass), two models built by the same code, and what torch.nn.init
itself says: the zero-element warning points at this file, and the values are those of the
plain functions."""

import inspect
import math
import warnings

import torch
from torch import nn

N_LAYER, N_EMBD = 2, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD)
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x):
        return x + self.c_proj(torch.relu(self.c_fc(x)))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(50, N_EMBD)
        self.h = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.head = nn.Linear(N_EMBD, 50, bias=False)
        self.head.weight = self.wte.weight  # tied: apply() reaches it twice, by one line
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * N_LAYER))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight.data, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, ids):
        x = self.wte(ids)
        for block in self.h:
            x = block(x)
        return self.head(x)


# The wrappers change nothing a script can see.
assert nn.init.normal_.__name__ == "normal_"
assert "std" in inspect.signature(nn.init.normal_).parameters
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    nn.init.kaiming_uniform_(torch.empty(0, 3))
assert [w.filename for w in caught] == [__file__], [(w.filename, w.lineno) for w in caught]
torch.manual_seed(1)
a = nn.init.trunc_normal_(torch.empty(5, 5), std=0.1)
torch.manual_seed(1)
plain = getattr(nn.init.trunc_normal_, "__wrapped__", nn.init.trunc_normal_)
b = plain(torch.empty(5, 5), std=0.1)
assert torch.equal(a, b)

torch.manual_seed(0)
teacher = GPT().eval()  # built by the same lines as the model: other tensors
model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(4):
    ids = torch.randint(0, 50, (4, 8))
    with torch.no_grad():
        target = teacher(ids).argmax(-1)
    loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), target.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
