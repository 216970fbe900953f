"""`unattributed_time` on the samples of a module's forward() called directly, as stack samples
showed it in pytorch/examples' mnist_forward_forward (its layers train through
`self.forward(x)`): the time is the model's, but no hook saw it."""

from __future__ import annotations

from helpers import series_inputs

from torchdoctor.diagnose import unattributed_time


def _inputs(function: str, code: str):  # type: ignore[no-untyped-def]
    inputs = series_inputs([1.0] * 60)
    inputs.steps.data["other"][:] = 0.05  # half of each 0.1 s step, outside every phase
    top = [{"function": function, "site": "main.py:74", "code": code, "share": 0.6}]
    inputs.events.append(
        {"kind": "gap_samples", "data": {"gaps": {"optimizer": {"samples": 40, "top": top}}}}
    )
    return inputs


def test_a_forward_called_directly_is_named_and_the_module_call_is_the_fix() -> None:
    (found,) = unattributed_time.diagnose(_inputs("forward", "g = self.forward(x).pow(2).mean(1)"))
    assert "a module's forward() called directly at main.py:74" in found.summary
    assert "runs none of the module's hooks" in found.summary
    assert found.fix[0].startswith("call the module, not its forward()")


def test_any_other_function_keeps_the_bookkeeping_advice() -> None:
    (found,) = unattributed_time.diagnose(_inputs("log_metrics", "log_metrics(loss)"))
    assert "log_metrics() called at main.py:74" in found.summary
    assert "hooks" not in found.summary and found.fix[0].startswith("if log_metrics()")


def test_unsampled_time_is_said_unknown_only_when_there_is_enough_of_it() -> None:
    # 40% of 3 ms steps, 21 steps judged: 25 ms in all, beside torchdoctor's own start (the
    # README's demo on a loaded machine); 15 steps of 20 ms in a slow fetch: worth saying.
    short = series_inputs([1.0] * 24)
    short.steps.data["duration"][:] = 0.003
    short.steps.data["other"][:] = 0.0012
    assert unattributed_time.diagnose(short) == []
    slow = series_inputs([1.0] * 15)
    slow.steps.data["duration"][:] = 0.03
    slow.steps.data["other"][:] = 0.02
    (found,) = unattributed_time.diagnose(slow)
    assert "not sampled" in found.summary


def test_a_few_preempted_steps_are_not_unknown_time() -> None:
    # The README's run beside a busy suite: 0.4 ms of each 6 ms step outside every phase, but
    # 9 ms in 1 step of 4 where the loop was preempted; half the time by the sums, none of it
    # the loop's own: not said. Where the typical step spends it too, it is.
    preempted = series_inputs([1.0] * 40)
    preempted.steps.data["other"][:] = 0.0004
    preempted.steps.data["other"][::4] = 0.05
    preempted.steps.data["duration"][:] = 0.006
    preempted.steps.data["duration"][::4] = 0.06
    assert unattributed_time.diagnose(preempted) == []
    preempted.steps.data["other"][:] = 0.004  # 4 of each 6 ms
    preempted.steps.data["other"][::4] = 0.05
    (found,) = unattributed_time.diagnose(preempted)
    assert "not sampled" in found.summary
