"""transformers.TextDataset, removed in transformers 5, with its behaviour: the file's text
tokenized whole and cut into blocks of block_size tokens (the tail dropped). The Hugging Face
program of the scorecard imports it from here instead (its one adaptation, see programs.py)."""

from __future__ import annotations

from typing import Any

import torch


class TextDataset(torch.utils.data.Dataset):
    def __init__(self, tokenizer: Any, file_path: str, block_size: int, **_: Any) -> None:
        # GPT-2's tokenizer adds no special tokens to a single sequence, so the blocks are
        # the token ids themselves (transformers 5 dropped build_inputs_with_special_tokens).
        with open(file_path, encoding="utf-8") as fh:
            ids = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(fh.read()))
        self.examples = [
            ids[i : i + block_size] for i in range(0, len(ids) - block_size + 1, block_size)
        ]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(self.examples[i], dtype=torch.long)
