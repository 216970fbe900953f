"""Bundled training scripts with planted problems, for `torchdoctor demo`.

Each entry: name -> (script file, one line on what is planted, extra `run` options).
"""

from __future__ import annotations

DEMOS: dict[str, tuple[str, str, list[str]]] = {
    "nan": (
        "nan_backward.py",
        "a feature that takes sqrt of a squared length: finite forward, NaN gradient at a "
        "padding row (step 12)",
        [],
    ),
    "leak": (
        "leak.py",
        "a list of loss tensors kept for logging: every step's graph stays alive",
        [],
    ),
    "dataloader": (
        "slow_data.py",
        "a Dataset doing heavy work in __getitem__, loaded with num_workers=0",
        [],
    ),
    "divergence": (
        "diverge.py",
        "a learning rate a hundred times too high, no warm-up, no clipping",
        [],
    ),
    "hang": (
        "hang.py",
        "a DataLoader worker that stops answering after a few batches",
        ["--hang-timeout", "3"],
    ),
    "no-gradient": (
        "no_gradient.py",
        "a head whose input is detached: its encoder never learns",
        ["--trace-every", "5"],
    ),
}
DEFAULT = "nan"
