"""Silent training bugs caught at run time (docs/silent-errors.md): each buggy script, recorded
in this process as `torchdoctor run` records it (tests/recording.py), is diagnosed with the
cause, the place and a step within the first few; its fixed twin, and scripts of legitimate
patterns that look like bugs (a GAN, gradient accumulation, frozen layers, evaluation passes,
RL), raise nothing above info."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import SCRIPTS
from recording import record

SEVERITY = {"info": 0, "warning": 1, "error": 2}


def at(script: str, text: str) -> str:
    """`script:line` of the first line of tests/scripts/`script` that holds `text`."""
    lines = (SCRIPTS / script).read_text().splitlines()
    return f"{script}:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def case(command: str, kind: str, where: str, step: int, **evidence: Any) -> Any:
    """A buggy script (with its arguments), the kind it must be diagnosed with, where (the end
    of the location), the latest step acceptable, and evidence it must carry."""
    return pytest.param(tuple(command.split()), kind, where, step, evidence, id=command)


ACC = "silent_accumulation.py"
SCHED = "silent_scheduler_unused.py"
LOSS = "silent_loss_inputs.py"
CLIP = "silent_clip_zero.py"
ORDER = "silent_step_order.py"
CASES = [
    case("silent_zero_grad.py", "grad_not_cleared", at("silent_zero_grad.py", ".step()"), 2),
    case("silent_zero_grad.py --clip-huge", "grad_not_cleared",
         at("silent_zero_grad.py", ".step()"), 2, untouched=True),
    case(ACC, "accumulation", at(ACC, ".backward()"), 3, problem="not_divided"),
    case(f"{ACC} --wrong-divisor", "accumulation", at(ACC, ".backward()"), 3, divisor=8),
    case(f"{ACC} --own-batches", "accumulation", at(ACC, ".backward()"), 3,
         problem="not_divided"),
    case(f"{ACC} --clear-each", "accumulation", at(ACC, "optimizer.step()"), 8,
         problem="cleared_each_micro_batch", micro_batches=4),
    case("silent_eval_mode.py", "eval_mode", at("silent_eval_mode.py", "    model.eval()"), 2),
    case("silent_eval_mode.py --functional", "eval_mode",
         at("silent_eval_mode.py", "    model.eval()"), 2,
         modules={"functional_dropout": {"count": 1, "names": [
             str(SCRIPTS / at("silent_eval_mode.py", "nn.functional.dropout("))]}}),
    case("silent_train_override.py", "train_not_called", "backbone", 1),
    case("silent_dropout_eval.py", "dropout_in_eval",
         at("silent_dropout_eval.py", "scaled_dot_product_attention("), 10, p=0.2),
    case("silent_unoptimized.py", "unoptimized_parameters", "fc", 3,
         parameters=["fc.weight", "fc.bias"]),
    case("silent_frozen.py", "frozen_model", "_fc", 1, trainable_modules=["BatchNorm2d"]),
    case("silent_scheduler_order.py", "scheduler_order",
         at("silent_scheduler_order.py", "    scheduler.step()"), 0, scheduler="StepLR"),
    case(SCHED, "scheduler_unused", at(SCHED, "ExponentialLR("), 10),
    case(f"{SCHED} --never", "scheduler_unused", at(SCHED, "ExponentialLR("), 30),
    case("diag_lr_zero.py", "lr_zero", "", 19, first_zero_step=0),
    case(ORDER, "no_gradient", at(ORDER, "        optimizer.step()"), 3, cleared=True),
    case(CLIP, "clip_to_zero", at(CLIP, "nn.utils.clip_grad_value_("), 0,
         function="clip_grad_value_", threshold=0.0),
    case(f"{CLIP} --norm", "clip_to_zero", at(CLIP, "nn.utils.clip_grad_norm_("), 0,
         function="clip_grad_norm_"),
    case("silent_detached_loss.py", "detached_loss",
         at("silent_detached_loss.py", "loss.backward()"), 2, leaf=True),
    case("silent_same_batch.py", "repeated_batch", "model", 3),
    case("silent_legit_gan.py --detached-generator", "no_gradient", "netG", 3,
         optimizer="optimizerG", modules=["netG"]),
    case("silent_worker_seed.py", "repeated_batch", "model", 3, num_workers=2),
    *[
        case(f"{LOSS} --problem {flag}", "loss_inputs", at(LOSS, "loss.backward()"), 1,
             problem=problem)
        for flag, problem in [
            ("log_softmax_axis", "log_softmax_axis"),
            ("nll_on_probabilities", "nll_on_probabilities"),
            ("nll_on_masked_probabilities", "nll_on_probabilities"),
            ("softmax_before_ce", "softmax_before_cross_entropy"),
            ("sigmoid_before_bce_with_logits", "sigmoid_before_bce_with_logits"),
            ("class_axis", "class_axis"),
            ("flatten_order", "flatten_order"),
            ("broadcast", "broadcast"),
            ("single_class", "single_class"),
        ]
    ],
    case("silent_update_effect.py", "ineffective_update",
         at("silent_update_effect.py", "optimizer.step()"), 2, optimizer_type="PlainSGD"),
    case("silent_autocast.py", "autocast_unused", at("silent_autocast.py", "loss.backward()"), 1,
         problem="float32"),
    case("silent_batch_collapsed.py", "batch_collapsed", "model", 3, batch_sizes=[16]),
    case("silent_init_repeated.py", "repeated_init",
         at("silent_init_repeated.py", "nn.init.normal_(module.weight"), 0, times=3,
         names=[f"model.encoder.layer.0.attention.{x}.weight" for x in "qkvo"]),
    case("silent_max_new_tokens.py", "max_new_tokens",
         at("silent_max_new_tokens.py", "answer = model.generate("), 0, max_new_tokens=8,
         new_tokens=12, prompt=6),
]  # fmt: skip

FIXED = sorted({c.values[0] for c in CASES})
LEGIT = [
    ("silent_legit_gan.py",),
    ("silent_legit_accumulation.py",),
    ("silent_legit_accumulation.py", "--tokens"),
    ("silent_legit_patterns.py",),
    ("silent_legit_rl.py",),
    ("silent_legit_init.py",),
    ("layerwise_optimizers.py", "25", "2", "3"),  # k-fold: the other folds' models in eval
]


def _found(tmp_path: Path, args: tuple[str, ...]) -> list[dict[str, Any]]:
    recorded = record(args[0], *args[1:], run_dir=tmp_path / "run")
    assert recorded.code == 0, recorded.exception
    return recorded.diagnoses()


def _loud(found: list[dict[str, Any]]) -> list[tuple[str, str]]:
    # How long a tiny model waits for its DataLoader (dataloader_bound) depends on the load of
    # the machine running the tests, not on the bug: left out.
    return [
        (d["kind"], d["summary"])
        for d in found
        if SEVERITY[d["severity"]] > 0 and d["kind"] != "dataloader_bound"
    ]


@pytest.mark.parametrize(("args", "kind", "where", "step", "evidence"), CASES)
def test_silent_bug_is_caught_with_its_cause_place_and_step(  # type: ignore[no-untyped-def]
    tmp_path, args, kind, where, step, evidence
) -> None:
    found = _found(tmp_path, args)
    mine = [d for d in found if d["kind"] == kind]
    assert mine, f"no {kind} among {[(d['kind'], d['summary']) for d in found]}"
    d = mine[0]
    assert SEVERITY[d["severity"]] >= 1, d
    assert (d["location"] or "").endswith(where), d["location"]
    assert d["step"] is not None and d["step"] <= step, (d["step"], d["summary"])
    for key, value in evidence.items():
        assert d["evidence"][key] == value, (key, d["evidence"])
    assert d["summary"] and d["fix"], d


@pytest.mark.parametrize("args", FIXED, ids=[" ".join(a) for a in FIXED])
def test_fixed_twin_raises_nothing_above_info(tmp_path, args) -> None:  # type: ignore[no-untyped-def]
    assert not _loud(_found(tmp_path, (*args, "--fixed")))


@pytest.mark.parametrize("args", LEGIT, ids=[" ".join(a) for a in LEGIT])
def test_legitimate_pattern_raises_nothing_above_info(tmp_path, args) -> None:  # type: ignore[no-untyped-def]
    assert not _loud(_found(tmp_path, args))


def test_generate_wrappers_are_put_back(tmp_path: Path) -> None:
    """generate() is wrapped on the mixin and on subclasses defined while watched; all of it is
    undone when the session ends."""
    from transformers.generation.utils import GenerationMixin

    import torchdoctor

    original = GenerationMixin.__dict__["generate"]
    with torchdoctor.Session(tmp_path / "run", quiet=True):
        assert GenerationMixin.__dict__["generate"] is not original
        assert GenerationMixin.generate.__wrapped__ is original  # type: ignore[attr-defined]

        class Own(GenerationMixin):
            def generate(self, *args: Any, **kwargs: Any) -> Any:
                return super().generate(*args, **kwargs)

        own = Own.__dict__["generate"]
        assert own.__wrapped__.__qualname__.endswith("Own.generate")
    assert GenerationMixin.__dict__["generate"] is original
    assert "__init_subclass__" not in GenerationMixin.__dict__
    assert Own.__dict__["generate"] is own.__wrapped__
