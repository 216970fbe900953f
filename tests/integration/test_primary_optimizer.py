"""Which optimizer's updates are the run's steps (telemetry/optimizers.py): the first that
steps, until a new one trains alone for HANDOVER updates in a row (a training phase of its
own, as pytorch/examples' mnist_forward_forward trains each layer with its own Adam). Two
optimizers that take turns, a GAN's, never hand over. Recorded in-process."""

from __future__ import annotations

from pathlib import Path

from recording import query, record

from torchdoctor.telemetry.optimizers import HANDOVER


def _changes(run_dir: Path) -> list[dict]:
    return query(run_dir, "SELECT step, data FROM python.events WHERE kind = 'primary_changed'")


def test_a_second_phase_with_its_own_optimizer_is_steps_too(tmp_path: Path) -> None:
    recorded = record("layerwise_optimizers.py", "60", run_dir=tmp_path / "run")
    assert recorded.code == 0, recorded.exception
    steps = query(recorded.run_dir, "SELECT count(*) AS n FROM python.steps")[0]["n"]
    # the second phase's first HANDOVER - 1 updates are rows of its own only
    assert steps == 60 + 60 - (HANDOVER - 1), steps
    changed = _changes(recorded.run_dir)
    assert [c["step"] for c in changed] == [60], changed  # the first phase's 60 steps, then
    assert not [d for d in recorded.diagnoses() if d["severity"] in ("warning", "error")]


def test_a_gans_two_optimizers_keep_the_first_as_primary(tmp_path: Path) -> None:
    recorded = record("silent_legit_gan.py", run_dir=tmp_path / "run")
    assert recorded.code == 0, recorded.exception
    steps = query(recorded.run_dir, "SELECT count(*) AS n FROM python.steps")[0]["n"]
    assert steps == 1024 // 16, steps  # the discriminator's updates, one per batch
    assert _changes(recorded.run_dir) == []
