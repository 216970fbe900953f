"""Diagnoses: one stateless module per kind, reading tables and events, returning records.

Each module in MODULES has `diagnose(Inputs) -> list[Diagnosis]`; the doctor thread
(torchdoctor/doctor.py) runs them all about once a second. A new kind is a new module here and
a line in MODULES.
"""

from __future__ import annotations

import importlib
from types import ModuleType

MODULES: tuple[str, ...] = (
    "nan",
    "divergence",
    "exploding_gradients",
    "vanishing_gradients",
    "zero_gradients",
    "clip_to_zero",
    "no_gradient",
    "not_learning",
    "dataloader_bound",
    "unattributed_time",
    "hang",
    "memory_leak",
    "oom",
    "crash",
    "recompilation",
    "graph_break",
    # Silent training bugs, from the facts telemetry/silent/ measures on sampled steps.
    "grad_not_cleared",
    "accumulation",
    "eval_mode",
    "train_not_called",
    "dropout_in_eval",
    "unoptimized_parameters",
    "frozen_model",
    "scheduler_order",
    "scheduler_unused",
    "lr_zero",
    "detached_loss",
    "repeated_batch",
    "loss_inputs",
    "ineffective_update",
    "autocast_unused",
    "batch_collapsed",
    "repeated_init",
    "max_new_tokens",
    # Job-level: they compare the ranks of a job (Inputs.job) and return nothing without one.
    "missing_rank",
    "uneven_batches",
    "collective_mismatch",
    "straggler",
    "rank_raised",
    "rank_died",
    "replica_drift",
    "same_batches",
)


def load_modules() -> list[ModuleType]:
    return [importlib.import_module(f"torchdoctor.diagnose.{name}") for name in MODULES]


def job_modules() -> list[ModuleType]:
    """The modules that compare ranks (`JOB = True`): what a job directory or the cluster verbs
    run over several ranks' tables."""
    return [m for m in load_modules() if getattr(m, "JOB", False)]


def job_kinds() -> set[str]:
    """The kinds of the job-level diagnoses."""
    return {m.__name__.rsplit(".", 1)[1] for m in job_modules()}
