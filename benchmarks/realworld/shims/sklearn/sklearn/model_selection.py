"""KFold as scikit-learn splits without shuffling: n_splits contiguous folds, the first
n % n_splits of them one sample longer; each split is (the other folds' indices, the fold's)."""

from __future__ import annotations

from collections.abc import Iterator, Sized

import numpy as np


class KFold:
    def __init__(
        self, n_splits: int = 5, *, shuffle: bool = False, random_state: int | None = None
    ):
        if shuffle:
            raise NotImplementedError("this stand-in splits without shuffling only")
        self.n_splits = n_splits

    def split(self, X: Sized) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        n = len(X)
        sizes = np.full(self.n_splits, n // self.n_splits, dtype=int)
        sizes[: n % self.n_splits] += 1
        indices = np.arange(n)
        start = 0
        for size in sizes:
            test = indices[start : start + size]
            yield np.concatenate([indices[:start], indices[start + size :]]), test
            start += size

    def get_n_splits(self) -> int:
        return self.n_splits
