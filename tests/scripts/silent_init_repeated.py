"""Weights initialised once per nested model class (TrainCheck's transformers-17877): every
model class calls post_init() at the end of its __init__, which applies _init_weights to every
module under it. The encoder's weights are initialised by the encoder, again by the model that
holds it, and again by the classification model around that: three times over, from the same
line. --fixed marks each module once it is initialised and skips it after that (transformers'
`_is_hf_initialized`)."""

import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
HIDDEN, LAYERS, VOCAB, CLASSES = 32, 2, 100, 3


class PreTrained(nn.Module):
    """What every model class shares, as in transformers' PreTrainedModel."""

    def post_init(self):
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if FIXED and getattr(module, "_initialized", False):
            return
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        module._initialized = True


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))
        self.o = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        weights = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) / HIDDEN**0.5, dim=-1)
        return self.o(weights @ self.v(x))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = Attention()
        self.norm = nn.LayerNorm(HIDDEN)
        self.mlp = nn.Sequential(
            nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN)
        )

    def forward(self, x):
        x = self.norm(x + self.attention(x))
        return x + self.mlp(x)


class Encoder(PreTrained):
    def __init__(self):
        super().__init__()
        self.layer = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.post_init()

    def forward(self, x):
        for layer in self.layer:
            x = layer(x)
        return x


class Model(PreTrained):
    def __init__(self):
        super().__init__()
        self.embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.encoder = Encoder()
        self.post_init()

    def forward(self, ids):
        return self.encoder(self.embeddings(ids))


class ForClassification(PreTrained):
    def __init__(self):
        super().__init__()
        self.model = Model()
        self.classifier = nn.Linear(HIDDEN, CLASSES)
        self.post_init()

    def forward(self, ids):
        return self.classifier(self.model(ids).mean(dim=1))


torch.manual_seed(0)
model = ForClassification()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(4):
    ids = torch.randint(0, VOCAB, (8, 12))
    labels = torch.randint(0, CLASSES, (8,))
    loss = nn.functional.cross_entropy(model(ids), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
