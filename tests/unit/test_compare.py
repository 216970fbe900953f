"""The pure parts of `compare`: the noise verdict of the bootstrap interval, the module that
carries a change (one module, or a group of repeated ones), the --fail-if grammar, and what
meta.json records of how a run was started; the comparison record's JSON shape."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from torchdoctor import run_setup
from torchdoctor._json import dumps
from torchdoctor.compare import gate
from torchdoctor.compare.build import compare
from torchdoctor.compare.facts import STEP_COLUMNS, RunFacts
from torchdoctor.compare.record import Comparison
from torchdoctor.compare.stats import change
from torchdoctor.compare.timing import ModuleChange, attribute, pattern


def _noisy(n: int, median: float, seed: int, spread: float = 0.3) -> np.ndarray:
    """Step times of a loaded machine: a long right tail around `median`."""
    rng = np.random.default_rng(seed)
    return median * np.exp(rng.normal(0.0, spread, n))


def test_the_same_distribution_is_noise() -> None:
    for seed in range(20):
        c = change(_noisy(60, 0.02, seed), _noisy(60, 0.02, seed + 100))
        assert not c.real, (seed, c)
        assert c.low is not None and c.low < 1 < c.high  # type: ignore[operator]


def test_a_shift_beyond_noise_is_real() -> None:
    c = change(_noisy(60, 0.02, 1), _noisy(60, 0.03, 2))
    assert c.real and 1.3 < c.ratio < 1.7  # type: ignore[operator]
    assert c.low is not None and c.low > 1.05
    # a tiny absolute change is not real, however sure
    c = change(_noisy(60, 1e-5, 1, 0.01), _noisy(60, 2e-5, 2, 0.01), min_delta=1e-3)
    assert not c.real


def test_a_run_that_drifts_raises_the_noise_floor() -> None:
    steady = _noisy(60, 0.02, 3, 0.05)
    drifting = np.concatenate([_noisy(30, 0.02, 4, 0.05), _noisy(30, 0.03, 5, 0.05)])
    c = change(steady, drifting)
    assert c.floor > 0.3  # the run differs from itself by ~50%
    assert not c.real


def test_too_few_values_are_not_judged() -> None:
    c = change([0.01, 0.02], [0.05, 0.06])
    assert c.low is None and not c.real


def _module(name: str, depth: int, a: float, b: float, stage: str = "backward") -> ModuleChange:
    c = change([a] * 5, [b] * 5)
    return ModuleChange(name, "M", depth, stage, c, (None, None), "both")


def test_the_change_is_carried_down_to_a_group_of_repeated_modules() -> None:
    mods = [_module("model", 0, 0.100, 0.131)]
    for i in range(3):
        mods += [
            _module(f"encoder.layers.{i}", 2, 0.020, 0.0305),
            _module(f"encoder.layers.{i}.attn", 3, 0.010, 0.0203),
            _module(f"encoder.layers.{i}.mlp", 3, 0.009, 0.0091),
        ]
    mods += [_module("encoder", 1, 0.070, 0.101), _module("head", 1, 0.010, 0.010)]
    cause = attribute(mods, "backward", 1.0)
    assert cause is not None
    assert (cause.module, cause.instances) == ("encoder.layers.*.attn", 3)
    assert cause.delta == pytest.approx(0.0309)


def test_one_module_of_a_group_is_named_alone() -> None:
    mods = [_module("model", 0, 0.05, 0.07, "forward")]
    mods += [_module(f"blocks.{i}", 1, 0.01, 0.03 if i == 1 else 0.01, "forward") for i in range(3)]
    cause = attribute(mods, "forward", 1.0)
    assert cause is not None and (cause.module, cause.instances) == ("blocks.1", 1)
    assert attribute(mods, "forward", -1.0) is None  # nothing got faster
    assert pattern("layers.10.attn.0") == "layers.*.attn.*"


def test_gate_grammar() -> None:
    (g,) = gate.parse("slower:5%")
    assert (g.kind, g.limit, g.relative) == ("slower", 0.05, True)
    gates = gate.parse("slower:20ms, loss:identical,memory:512MiB")
    assert [(g.kind, g.limit, g.relative, g.exact) for g in gates] == [
        ("slower", pytest.approx(0.02), False, False),
        ("loss", 0.0, False, True),
        ("memory", 512 * 2**20, False, False),
    ]
    for bad in ("faster:5%", "slower", "slower:", "slower:quick", "memory:lots", "loss:x%"):
        with pytest.raises(gate.GateError):
            gate.parse(bad)


def test_environment_that_matters_with_secrets_masked() -> None:
    env = {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_DEBUG": "INFO",
        "OMP_NUM_THREADS": "4",
        "TORCH_HUB_TOKEN": "abcdef123456",
        "NCCL_IB_HCA": "mlx5",
        "HOME": "/root",
        "TORCHDOCTOR_TOKEN": "x" * 20,
        "PATH": "/bin",
    }
    assert run_setup.environment(env) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_HCA": "mlx5",
        "OMP_NUM_THREADS": "4",
        "TORCH_HUB_TOKEN": "***",
    }


def test_a_longer_wait_for_a_cpu_can_explain_a_slowdown() -> None:
    from torchdoctor.compare.contention import allowed, judge, waiting_share

    slower = change(_noisy(60, 0.02, 1, 0.1), _noisy(60, 0.026, 2, 0.1))
    assert slower.real  # 30% slower, as measured
    # B's main thread waited for a CPU 40% of its time, A's a tenth: the machine alone can make
    # B's steps 1.5 times longer
    assert allowed(0.10, 0.40) == (pytest.approx(1.5), 1.0)
    assert not judge(slower, 0.10, 0.40).real
    # the other way round (B slept: its share of waiting went down) it explains nothing
    assert judge(slower, 0.40, 0.10).real
    assert judge(slower, None, 0.40) is slower  # not recorded: judged as measured
    meta = {"machine": {"start": {"time": 0.0, "wait": 1.0}, "last": {"time": 10.0, "wait": 3.5}}}
    assert waiting_share(meta) == pytest.approx(0.25)
    assert waiting_share({"machine": {"start": {"time": 0.0, "wait": 1.0}}}) is None
    # from the end of the first step when recorded: the steps' share, not the imports'
    meta["machine"]["steps"] = {"time": 5.0, "wait": 1.0}
    assert waiting_share(meta) == pytest.approx(0.5)


def _facts(source: str, ranks: tuple[int, ...], loss_from: int | None = None) -> RunFacts:
    """A run of 40 steps of 10 ms per rank; the loss changes from `loss_from` on."""
    rng = np.random.default_rng(len(source))
    cols: dict[str, list[np.ndarray]] = {c: [] for c in STEP_COLUMNS}
    for rank in ranks:
        n = 40
        loss = np.linspace(2.0, 1.0, n)
        if loss_from is not None:
            loss[loss_from:] *= 1.5
        values = {
            "rank": np.full(n, rank),
            "step": np.arange(n),
            "duration": 0.01 * np.exp(rng.normal(0, 0.05, n)),
            "loss": loss,
            "traced": np.zeros(n, dtype=bool),
        }
        for c in STEP_COLUMNS:
            cols[c].append(values.get(c, np.full(n, np.nan)))
    steps = {c: np.concatenate(v) for c, v in cols.items()}
    steps["rank"], steps["step"] = steps["rank"].astype(np.int64), steps["step"].astype(np.int64)
    empty: list[dict[str, Any]] = []
    return RunFacts(
        source, {}, steps, ranks[0], list(ranks), [], empty, empty, empty, {}, False, empty,
        empty, empty, None, None,
    )  # fmt: skip


def test_the_comparison_is_a_record_whose_json_keeps_its_shape() -> None:
    """compare() gives a Comparison read by field; its JSON (`compare --format json`) has
    the keys it always had: the gates only when given, the gap after a difference only where
    the curves differ, a rank only one run has as {"rank", "in"}."""
    a, b = _facts("a", (0,)), _facts("b", (0,), loss_from=7)
    r = compare(a, b)
    assert isinstance(r, Comparison) and r.gates is None and r.failed is None
    assert r.curves.loss.first_difference == 7 and r.curves.grad_norm.first_difference is None
    j = json.loads(dumps(r))
    assert list(j) == [f.name for f in dataclasses.fields(Comparison)][:-2]
    assert list(j["step_time"])[-2:] == ["real_as_measured", "machine_allows"]
    assert {"at_first", "gap_median", "gap_max"} <= set(j["curves"]["loss"])
    assert "at_first" not in j["curves"]["grad_norm"]
    assert j["cause"] == {"phase": None, "module": None}

    gated = compare(a, b, gate.parse("loss:identical,slower:50%"))
    assert gated.failed and [v.exceeded for v in gated.gates or ()] == [True, False]
    j = json.loads(dumps(gated))
    assert j["failed"] is True
    assert j["gates"][0] == {
        "gate": "loss:identical",
        "exceeded": True,
        "why": "the loss differs from step 7",
    }

    job = compare(_facts("c", (0, 1)), _facts("d", (0,)))
    assert job.ranks is not None and job.ranks[1].only_in == "A"
    assert json.loads(dumps(job))["ranks"][1] == {"rank": 1, "in": "A"}
