"""Synthetic data for the programs, written into a program's cached copy once (--populate).

Every corpus is learnable (a healthy run's loss falls): text is drawn from a small Markov
chain over a fixed vocabulary, so a model that learns the transitions does better than
chance, and a run that does not learn is a real finding, not an artefact of noise.
All of it is seeded: the same bytes on every machine.
"""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import numpy as np

WORDS = 120


def _vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: set[str] = set()
    while len(words) < WORDS:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(2, 7))))
    return sorted(words)


def markov_text(n_words: int, seed: int, line_every: int = 12) -> str:
    """Words of a fixed vocabulary, each followed by one of 3 likely successors."""
    rng = random.Random(seed)
    vocab = _vocabulary(random.Random(0))
    follow = {w: random.Random(i).sample(vocab, 3) for i, w in enumerate(vocab)}
    word = vocab[0]
    lines, line = [], []
    for i in range(n_words):
        word = rng.choice(follow[word]) if rng.random() < 0.9 else rng.choice(vocab)
        line.append(word)
        if (i + 1) % line_every == 0:
            lines.append(" ".join(line))
            line = []
    if line:
        lines.append(" ".join(line))
    return "\n".join(lines) + "\n"


def word_corpus(root: Path, directory: str, train: int, valid: int, test: int) -> None:
    """train.txt / valid.txt / test.txt as pytorch/examples' word_language_model reads them."""
    out = root / directory
    out.mkdir(parents=True, exist_ok=True)
    for name, n, seed in (("train", train, 1), ("valid", valid, 2), ("test", test, 3)):
        (out / f"{name}.txt").write_text(markov_text(n, seed))


def single_text(root: Path, path: str, words: int, seed: int = 1) -> None:
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(markov_text(words, seed))


def char_bins(root: Path, directory: str, train_chars: int, val_chars: int) -> None:
    """nanoGPT's data/<dataset>/{train,val}.bin (uint16 token ids) and meta.pkl, characters
    of the Markov text, as data/shakespeare_char/prepare.py lays them out."""
    out = root / directory
    out.mkdir(parents=True, exist_ok=True)
    train = markov_text(train_chars // 5, 1)[:train_chars]
    val = markov_text(val_chars // 5, 2)[:val_chars]
    chars = sorted(set(train + val))
    stoi = {c: i for i, c in enumerate(chars)}
    itos = dict(enumerate(chars))
    for name, text in (("train", train), ("val", val)):
        np.array([stoi[c] for c in text], dtype=np.uint16).tofile(out / f"{name}.bin")
    with open(out / "meta.pkl", "wb") as fh:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, fh)


def tiny_gpt2(root: Path, directory: str, text_path: str, words: int) -> None:
    """A local stand-in for a hub checkpoint: a 2-layer GPT-2 with random weights and a
    byte-level BPE tokenizer trained on the Markov text, saved where from_pretrained(NAME)
    finds it as a local directory (no hub access), and the training text itself."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    single_text(root, text_path, words)
    out = root / directory
    out.mkdir(parents=True, exist_ok=True)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        [markov_text(5000, 7)], vocab_size=400, min_frequency=2, special_tokens=["<|endoftext|>"]
    )
    tok.save_model(str(out))
    vocab = len(tok.get_vocab())
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=128,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    GPT2LMHeadModel(config).save_pretrained(str(out))


def sine_waves(root: Path, path: str, waves: int, length: int, period: float = 20.0) -> None:
    """`waves` sine waves of `length` points, each shifted by a random whole number of
    points (float64, as time_sequence_prediction's own generator makes them), saved with
    torch.save as the program loads them."""
    import torch

    rng = np.random.default_rng(2)
    shift = rng.integers(-4 * int(period), 4 * int(period), waves).reshape(waves, 1)
    points = np.arange(length) + shift
    out = root / path
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(np.sin(points / period).astype("float64"), out)


def cora(root: Path, directory: str, nodes: int, features: int, classes: int, edges: int) -> None:
    """A citation graph in Cora's two files, as the graph examples read them: `cora.content`
    (a paper's id, its 0/1 word features, its class name, tab-separated) and `cora.cites`
    (pairs of ids). A paper's class shows in its words (each class has words it uses more)
    and in whom it cites (most citations stay within the class): learnable from both."""
    rng = random.Random(3)
    ids = rng.sample(range(1, 10**6), nodes)
    labels = [rng.randrange(classes) for _ in range(nodes)]
    out = root / directory
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(nodes):
        words = [
            "1"
            if rng.random() < 0.02 or (j % classes == labels[i] and rng.random() < 0.25)
            else "0"
            for j in range(features)
        ]
        rows.append("\t".join([str(ids[i]), *words, f"class_{labels[i]}"]))
    (out / "cora.content").write_text("\n".join(rows) + "\n")
    members: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        members.setdefault(label, []).append(i)
    pairs = []
    for _ in range(edges):
        a = rng.randrange(nodes)
        b = rng.choice(members[labels[a]]) if rng.random() < 0.8 else rng.randrange(nodes)
        pairs.append(f"{ids[a]}\t{ids[b]}")
    (out / "cora.cites").write_text("\n".join(pairs) + "\n")


def mnist_processed(root: Path, directory: str, train: int, test: int) -> None:
    """MNIST as `torch.save((images, labels))` files, `training.pt` and `test.pt`, the form
    Lightning's demo MNIST reads: uint8 28x28 images, each its class's fixed template plus
    noise (learnable, as the torchvision stand-in's)."""
    import torch

    generator = torch.Generator().manual_seed(5)
    templates = torch.rand(10, 28, 28, generator=generator)
    out = root / directory
    out.mkdir(parents=True, exist_ok=True)
    for name, n in (("training.pt", train), ("test.pt", test)):
        labels = torch.randint(0, 10, (n,), generator=generator)
        noise = 0.3 * torch.rand(n, 28, 28, generator=generator)
        images = ((0.7 * templates[labels] + noise) * 255).to(torch.uint8)
        torch.save((images, labels), out / name)
