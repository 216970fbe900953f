"""`torchdoctor repro` on a real training script that seeds nothing (initialisation, shuffle,
dropout, an augmentation drawn from `random` and NumPy), the same script with its initial
weights loaded from a file (only the dropout masks differ), and its seeded version
(bit-identical).

The verb is run end to end (its two child processes, JSON and exit code) on the unseeded
script; the others run the recipe's training half twice in this process (tests/recording.py
`recipe`, the generators seeded afresh each time as in a new process) and compare the runs as
the verb does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import cli, line_of, script
from recording import Output, recipe, td

from torchdoctor.recipes.compare import ReproVerdict

TRAIN = script("repro_train.py")


def _repro(env: dict[str, str], cwd: Path, *target: str) -> tuple[int, Any, str]:
    out = cli("repro", "--steps", "3", "--format", "json", TRAIN, *target, env=env, cwd=cwd,
              timeout=180)  # fmt: skip
    return out.returncode, json.loads(out.stdout) if out.stdout else None, out.stderr


def _twice(cwd: Path, *target: str) -> tuple[ReproVerdict, list[Output]]:
    """The two runs of `torchdoctor repro --steps 3 TRAIN TARGET...`, compared."""
    from torchdoctor.recipes.compare import compare

    runs, printed = [], []
    for n in (1, 2):
        result, out = recipe("repro", 3, TRAIN, *target, cwd=cwd / f"run{n}")
        assert out.returncode == 0 and result is not None, out.stderr
        runs.append(result)
        printed.append(out)
    return compare(runs[0], runs[1]), printed


def _line(text: str) -> int:
    """The line of repro_train.py that holds `text`."""
    return line_of("repro_train.py", text)


def test_unseeded_script_names_every_source_with_its_call_site(env, tmp_path) -> None:
    # the verb end to end: two child processes, the JSON verdict, exit code 1
    code, r, err = _repro(env, tmp_path)
    assert code == 1, err
    assert r["identical"] is False and r["steps"] == [3, 3]
    first = r["first_difference"]
    assert first["step"] == 0 and first["what"] == "initial_params"
    assert first["param"] == "0.weight" and first["op"] == "kaiming_uniform_"
    model, loop, forward = _line("model = nn.Seq"), _line("for x, y in"), _line("model(x + noise)")
    assert first["site"].endswith(f"repro_train.py:{model}")
    sources = {s["source"]: s for s in r["sources"]}
    assert list(sources) == ["random", "numpy", "torch_cpu"]
    augment = str(_line("uniform"))
    assert [s.rsplit(":", 1)[1] for s in sources["random"]["sites"]] == [augment]
    assert [s.rsplit(":", 1)[1] for s in sources["numpy"]["sites"]] == [augment]
    # the model's initialisation, the shuffle (the sampler draws at the loop) and the dropout
    sites = [int(s.rsplit(":", 1)[1]) for s in sources["torch_cpu"]["sites"]]
    assert sites == [model, loop, forward]
    assert r["fix"] == ["random.seed(0)", "np.random.seed(0)", "torch.manual_seed(0)"]
    assert not all(row["loss_equal"] for row in r["series"])


@pytest.mark.slow
def test_dropout_alone_is_found_in_its_module(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    init = tmp_path / "init.pt"
    with torch.random.fork_rng():  # made here, not in a Python of its own: torch is imported
        torch.manual_seed(1)
        model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2))
        torch.save(model.state_dict(), init)
    r, _ = _twice(tmp_path, "--init", str(init))
    assert r.identical is False
    first = r.first_difference
    assert first is not None and first.step == 0 and first.what == "op"
    assert (first.op, first.module, first.module_type) == ("dropout", "model.2", "Dropout")
    assert first.site is not None
    assert first.site.endswith(f"repro_train.py:{_line('model(x + noise)')}")
    assert r.fix == ["torch.manual_seed(0)"]  # no random.seed: it is not used here
    out = td("repro", "nothere.py", cwd=tmp_path)
    assert out.returncode == 2 and "can't open file 'nothere.py'" in out.stderr


def test_seeded_script_is_bit_identical(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from torchdoctor.report.repro import render_repro

    r, printed = _twice(tmp_path, "--seeded")
    assert r.identical is True
    text = render_repro(r)  # what the verb prints
    assert "repro PASSED: the two runs are bit-identical over 3 steps" in text
    assert "without a seed" not in text and "Fix:" not in text
    for out in printed:  # stopped at step 3
        assert out.stderr.count("done") == 0 and out.stdout.count("done") == 0
