"""A word-level LSTM language model in the style of pytorch/examples word_language_model: no
torch.optim (the parameters are updated by hand with p.data.add_), clip_grad_norm_, truncated
backpropagation through time, and the whole model saved with torch.save(model) and loaded back.
"""

import torch
from common import seed, show
from torch import nn


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int, nhid: int) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 2, dropout=0.2)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid

    def forward(self, data: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]):  # type: ignore[no-untyped-def]
        emb = self.drop(self.encoder(data))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)).view(-1, self.decoder.out_features), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = next(self.parameters())
        return (weight.new_zeros(2, bsz, self.nhid), weight.new_zeros(2, bsz, self.nhid))


def main() -> None:
    seed()
    ntokens, bptt, batch = 50, 12, 8
    corpus = torch.randint(0, ntokens, (bptt * 10 + 1, batch))
    model = RNNModel(ntokens, 16, 32)
    criterion = nn.NLLLoss()
    lr = 5.0
    hidden = model.init_hidden(batch)
    for i in range(0, corpus.size(0) - 1, bptt):
        data, targets = corpus[i : i + bptt], corpus[i + 1 : i + 1 + bptt].reshape(-1)
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(torch.log_softmax(output, dim=-1), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        show("loss", loss.item())
    with open("model.pt", "wb") as f:
        torch.save(model, f)
    with open("model.pt", "rb") as f:
        loaded = torch.load(f, weights_only=False)
    loaded.eval()
    model.eval()
    with torch.no_grad():
        a = model(corpus[:bptt], model.init_hidden(batch))[0]
        b = loaded(corpus[:bptt], loaded.init_hidden(batch))[0]
    print("reloaded equal", bool(torch.equal(a, b)))


if __name__ == "__main__":
    main()
