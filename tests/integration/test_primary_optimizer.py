"""Which optimizer's updates are the run's steps (telemetry/optimizers.py): the first that
steps, until another trains alone for HANDOVER updates in a row (a training phase of its own,
as pytorch/examples' mnist_forward_forward trains each layer with its own Adam, or the next
fold of a k-fold run); its updates before that are steps too (handover.py). Two optimizers
that take turns, a GAN's, never hand over. Recorded in-process."""

from __future__ import annotations

from pathlib import Path

from recording import query, record

from torchdoctor.telemetry.optimizers import HANDOVER


def _changes(run_dir: Path) -> list[dict]:
    return query(run_dir, "SELECT step, data FROM python.events WHERE kind = 'primary_changed'")


def test_a_second_phase_with_its_own_optimizer_is_steps_too(tmp_path: Path) -> None:
    recorded = record("layerwise_optimizers.py", "60", run_dir=tmp_path / "run")
    assert recorded.code == 0, recorded.exception
    steps = query(
        recorded.run_dir,
        "SELECT count(*) AS n, count(DISTINCT step) AS numbers, max(step) AS last, "
        "count(loss) AS losses, sum(duration) AS seconds FROM python.steps",
    )[0]
    # every update a step, the second phase's first HANDOVER - 1 included, numbered in order
    assert (steps["n"], steps["numbers"], steps["last"], steps["losses"]) == (120, 120, 119, 120)
    updates = query(
        recorded.run_dir,
        "SELECT optimizer, is_primary, count(*) AS n, min(step) AS first, max(step) AS last "
        "FROM python.optimizer_steps GROUP BY ALL ORDER BY first",
    )
    # each phase's updates are the primary's, at their own steps; none twice
    assert [(u["optimizer"], u["is_primary"], u["n"], u["first"], u["last"]) for u in updates] == [
        ("opt", True, 1, 59, 59),  # the first phase's: a row from the step a second was seen
        ("opt2", True, 60, 60, 119),  # the loop's name for both: numbered from the second
    ], updates
    changed = _changes(recorded.run_dir)
    assert [c["step"] for c in changed] == [60], changed  # where the second phase began
    assert not [d for d in recorded.diagnoses() if d["severity"] in ("warning", "error")]
    # the held updates' phases are theirs: no step of the second phase is HANDOVER long
    durations = query(
        recorded.run_dir, "SELECT step, duration FROM python.steps WHERE step >= 60 ORDER BY step"
    )
    longest = max(d["duration"] for d in durations)
    assert longest < 0.5 * sum(d["duration"] for d in durations), durations


def test_the_folds_of_a_kfold_run_take_turns_by_the_fold(tmp_path: Path) -> None:
    # 2 epochs of 3 folds of 25 updates: an earlier fold's optimizer comes back each epoch
    assert HANDOVER < 25  # each fold long enough to be a phase of its own
    recorded = record("layerwise_optimizers.py", "25", "2", "3", run_dir=tmp_path / "run")
    assert recorded.code == 0, recorded.exception
    steps = query(recorded.run_dir, "SELECT count(*) AS n, max(step) AS last FROM python.steps")
    assert steps == [{"n": 150, "last": 149}], steps
    changed = [c["step"] for c in _changes(recorded.run_dir)]
    assert changed == [25, 50, 75, 100, 125], changed
    primary = query(
        recorded.run_dir,
        "SELECT count(*) AS n FROM python.optimizer_steps WHERE NOT is_primary",
    )
    assert primary == [{"n": 0}], primary  # every update was the step of its fold


def test_a_gans_two_optimizers_keep_the_first_as_primary(tmp_path: Path) -> None:
    recorded = record("silent_legit_gan.py", run_dir=tmp_path / "run")
    assert recorded.code == 0, recorded.exception
    steps = query(recorded.run_dir, "SELECT count(*) AS n FROM python.steps")[0]["n"]
    assert steps == 1024 // 16, steps  # the discriminator's updates, one per batch
    assert _changes(recorded.run_dir) == []
