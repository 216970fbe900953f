"""The per-step gradient check and the `--guard` policy.

Before an update: the total gradient norm (reused from clip_grad_norm_ when the script clips),
read at once on CPU (or when the guard or a NaN hunt needs it before the update) and
otherwise left on the device for an asynchronous read-back; whether it and the step's losses
are finite. With `--guard`, an update whose gradients are not finite is dropped by removing
the gradients, which every torch optimizer skips.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from torchdoctor.native import grad_squares, sum_of_squares
from torchdoctor.telemetry import gradients
from torchdoctor.telemetry.local_shards import local


@dataclasses.dataclass
class Check:
    params: list[Any]  # parameters with a gradient
    norm: Any  # total norm as a tensor (or the float clip_grad_norm_ gave), None: no gradient
    value: float | None  # the norm read back now; None when it is left for the read-back

    @property
    def finite(self) -> bool:
        return self.value is None or math.isfinite(self.value)


class GradientCheck:
    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self._plans: dict[int, gradients.NormPlan] = {}

    def measure(
        self, key: int, params: list[Any], grads: list[Any], clip_norm: Any, read_now: bool
    ) -> Check:
        """The norm of `grads` (`key` tells optimizers apart: each has its own norm plan)."""
        if clip_norm is not None:
            norm = local(clip_norm) if hasattr(clip_norm, "shape") else clip_norm
        elif grads:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._plans[key] = gradients.NormPlan()
            if read_now and plan.small(grads):
                # A few small CPU gradients: one native pass, no torch op (summed in double,
                # so float32 squares do not overflow: the value the float64 retry gives)
                squares = sum_of_squares(grads)
                if squares is not None:
                    value = math.sqrt(squares)
                    return Check(params, value, value)
            norm = plan(self.torch, grads)
        else:
            norm = None
        if norm is None or not read_now:
            return Check(params, norm, None)
        value = float(norm)
        if not math.isfinite(value) and gradients.all_finite(self.torch, grads):
            # Finite gradients whose squares overflow float32: not a NaN, a huge norm.
            norm = gradients.total_norm(self.torch, grads, dtype=self.torch.float64)
            value = float(norm)
        return Check(params, norm, value)

    def of_optimizer(self, optimizer: Any, clip_norm: Any, read_now: bool) -> Check:
        if clip_norm is None and read_now:
            # Plain CPU gradients of a small model (the common case on a CPU): their squares
            # read in C++ from the parameters, with no list of gradients made here.
            params = gradients.parameters(optimizer)
            quick = grad_squares(params, gradients.NATIVE_MAX)
            if quick is not None:
                squares, with_grad = quick
                if with_grad < len(params):
                    params = [p for p in params if p.grad is not None]
                value = math.sqrt(squares) if with_grad else None
                return Check(params, value, value)
        params, grads = gradients.collect(optimizer)
        return self.measure(id(optimizer), params, grads, clip_norm, read_now)

    def of_params(self, key: int, params: list[Any], read_now: bool) -> Check:
        with_grad = [p for p in params if p.grad is not None]
        return self.measure(key, with_grad, [local(p.grad) for p in with_grad], None, read_now)


def guard_update(check: Check) -> bool:
    """--guard: drop the gradients of a non-finite step so the optimizer skips the update."""
    if check.finite:
        return False
    for p in check.params:
        p.grad = None  # torch optimizers skip parameters without a gradient
    return True
