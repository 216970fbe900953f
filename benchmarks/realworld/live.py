"""Checks of the live verbs and the recipes on the real programs: what a person types at a
running training (eval, backtrace) and `torchdoctor overfit`, with what a truthful answer
holds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LiveCheck:
    """`torchdoctor PID <verb...>` while the program runs under torchdoctor, asked once the
    program has printed a line matching `after`; the answer must match `expect`."""

    name: str
    program: str
    verb: tuple[str, ...]
    expect: str  # regex over the verb's stdout and stderr
    after: str  # regex of a line of the program's stdout
    why: str


@dataclass(frozen=True)
class OverfitCheck:
    """`torchdoctor overfit --steps N --format json script ARGS`: the suspects it names must
    not match `not_suspect` (a healthy setting wrongly blamed); `passes` when it must
    memorise."""

    name: str
    program: str
    steps: int
    not_suspect: str  # regex over the suspects' JSON
    passes: bool
    why: str


LIVE: tuple[LiveCheck, ...] = (
    LiveCheck(
        name="mnist_eval_locals_of_main",
        program="mnist",
        verb=("eval", "print(type(model).__name__, type(optimizer).__name__)"),
        expect=r"Net Adadelta",
        after=r"Train Epoch: 1 \[0/",
        why="model and optimizer are locals of main(): eval must reach them (the training "
        "frame's names), not only __main__'s globals",
    ),
    LiveCheck(
        name="mnist_backtrace",
        program="mnist",
        verb=("backtrace",),
        expect=r"main\.py",
        after=r"Train Epoch: 1 \[0/",
        why="the main thread's stack holds the script's frames",
    ),
    LiveCheck(
        name="word_lm_eval_globals",
        program="word_language_model",
        verb=("eval", "print(type(model).__name__, args.bptt)"),
        expect=r"RNNModel 20",
        after=r"\| epoch +1 \| +10/",
        why="a control: module-level names of the script",
    ),
    LiveCheck(
        name="dcgan_eval_two_models",
        program="dcgan",
        verb=("eval", "print(type(netG).__name__, type(optimizerD).__name__)"),
        expect=r"Generator Adam",
        after=r"^\[0/1\]\[0/",
        why="a control on the program with two optimizers",
    ),
)

OVERFIT: tuple[OverfitCheck, ...] = (
    OverfitCheck(
        name="hf_overfit_not_reduction",
        program="hf_trainer_gpt2",
        steps=40,
        not_suspect=r"reduction",
        passes=False,
        why="transformers' causal-LM loss sums with reduction='sum' and divides by the number "
        "of tokens itself: not a suspect",
    ),
    OverfitCheck(
        name="mnist_overfit_memorises",
        program="mnist",
        steps=60,
        not_suspect=r"reduction",
        passes=True,
        why="the example's CNN memorises one batch of 64",
    ),
)
