"""What other parts may read of a training run in progress, as narrow typed views.

The Recorder (telemetry/) provides `TrainingView`; memory/, the doctor and the NaN replay read
the run through it, never through the Session or the Recorder's internals. A view is read on
other threads than the training one: every member is safe to read at any time (a value may be
one step old).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


@dataclasses.dataclass(kw_only=True)
class ModuleCall:
    """One module call of a traced step: a python.shapes row without its rank (fields in the
    table's column order). A crash's evidence keeps those that flowed into the module that
    raised; `torchdoctor shapes` reads them back with their rank (telemetry.shapes.ShapeCall)."""

    step: int
    call: int
    module: str
    type: str
    depth: int
    input_shapes: str | None
    input_dtypes: str | None
    input_devices: str | None
    output_shapes: str | None
    output_dtypes: str | None
    output_devices: str | None
    raised: bool | None


class ModelIndex(Protocol):
    """The models of the run and the qualified names of their modules and parameters."""

    def roots(self) -> list[tuple[Any, str]]:
        """Every outermost module called (models and loss modules), with its label."""
        ...

    def models(self) -> list[tuple[Any, str]]:
        """Roots that own parameters: the models."""
        ...

    def name_of(self, module: Any) -> str: ...

    def param_name(self, param: Any) -> tuple[str, str] | None:
        """(qualified module name, parameter name) of a parameter of a known model."""
        ...


def indexed(module: Any) -> bool:
    """A container whose modules are named by their index (Sequential, ModuleList): its
    modules' names (`4`) do not say which model they are in without the model's own name
    (`net.4`), wherever modules and parameters are named."""
    first = next(iter(getattr(module, "_modules", None) or {}), None)
    return isinstance(first, str) and first.isdigit()


class TrainingView(Protocol):
    @property
    def step(self) -> int:
        """The step in progress, counted from 0."""
        ...

    @property
    def steps_done(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def models(self) -> ModelIndex: ...

    @property
    def phase(self) -> str:
        """What the training thread runs now: data, forward, backward, optimizer or other."""
        ...

    @property
    def primary(self) -> Any:
        """The optimizer whose steps are python.steps (None before the first step)."""
        ...

    def lr(self, optimizer: Any = None) -> float | None: ...

    def model_inputs(self) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
        """The model calls of the step in progress: (module, args, kwargs), the first few."""
        ...

    def last_traced_backward(self) -> str | None:
        """The module whose backward started last, on a traced step (else None)."""
        ...

    def module_calls(self) -> tuple[int | None, list[ModuleCall], bool]:
        """(step, its module calls with shapes, whether it is the step in progress): the step
        in progress when it is recorded (the first step, traced steps), else the last one that
        was."""
        ...

    def request_trace(self) -> None:
        """Trace the next step's module calls (a diagnosis wants per-module detail)."""
        ...

    def request_gap_samples(self) -> bool:
        """Take stack samples of the time outside every phase, for a short window (gap_sampler:
        an input function of the loop's own is then found and counted as data); False when a
        window runs or the run has had its windows."""
        ...

    def settle_collectives(self) -> None:
        """End the collectives whose work has completed since they were last looked at (any
        thread): a rank stopped between two calls must not show its last one as pending."""
        ...

    def forward_facts(self) -> dict[str, Any]:
        """Grad mode at the step's first model call, parameters that train, whether a model
        checkpoints its activations, the loss's nearest autograd nodes, values still unread on
        a GPU (facts that rank an error's causes)."""
        ...
