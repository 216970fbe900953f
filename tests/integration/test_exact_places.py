"""Exact places under the trainer libraries, recorded in this process: the line given for a
loss is the user's line nearest the model call (the `training_step` line under Lightning,
`compute_loss` under Hugging Face's Trainer), never the launcher's `trainer.fit(...)`; modules
are named by their qualified names (`net.0` for Lightning's `self.net`, `transformer.wte`)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from helpers import SCRIPTS
from recording import record

from torchdoctor.diagnose.story import LOWER_LR
from torchdoctor.store.saved import open_run


def _line(path: Path, text: str, after: int = 0) -> int:
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if i > after and text in line)


def test_lightning_names_the_training_step_line_and_the_modules_it_holds(tmp_path: Path) -> None:
    recorded = record(
        "lightning_train.py",
        "--root",
        str(tmp_path / "root"),
        "--lr",
        "1e4",
        "--steps",
        "6",
        run_dir=tmp_path / "run",
    )
    assert recorded.code == 0, recorded.exception
    (nan,) = [d for d in recorded.diagnoses() if d["kind"] == "nan"]
    step_line = _line(SCRIPTS / "lightning_train.py", "self.net(x)")
    assert nan["evidence"]["backward_site"].endswith(f"lightning_train.py:{step_line}")
    assert (
        "trainer.fit"
        not in (SCRIPTS / "lightning_train.py").read_text().splitlines()[step_line - 1]
    )
    modules = set(open_run(recorded.run_dir).block("torch_trace").column("module"))
    assert modules == {"net", "net.0", "net.1", "net.2"}


@pytest.mark.timeout(300)
def test_hugging_face_names_compute_loss_and_a_damaged_checkpoint(tmp_path: Path) -> None:
    recorded = record(
        "hf_train.py",
        "--out",
        str(tmp_path / "out"),
        "--plant-nan",
        "--steps",
        "2",
        run_dir=tmp_path / "run",
    )
    assert recorded.code == 0, recorded.exception
    (nan,) = [d for d in recorded.diagnoses() if d["kind"] == "nan"]
    from transformers import Trainer

    source, first = inspect.getsourcelines(Trainer.compute_loss)
    at = first + next(i for i, line in enumerate(source) if "= model(**inputs)" in line)
    assert nan["evidence"]["backward_site"].endswith(f"transformers/trainer.py:{at}")
    assert nan["location"] == "transformer.wte"
    # The weights were bad before any update: not the learning rate's doing.
    assert "before the first update" in nan["summary"]
    assert not any(f.startswith(LOWER_LR) for f in nan["fix"].splitlines())
