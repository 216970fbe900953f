"""What torchdoctor says when one of its hooks meets an error, and what it never frees."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from torchdoctor import _failsafe
from torchdoctor._failsafe import Switch, first_line, keep_to_exit


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    """Each test here says its warning afresh, and leaves the once-only record as it was: a
    later test on this worker must still see its own first warning."""
    before = set(_failsafe._said)
    _failsafe._said.clear()
    yield
    _failsafe._said.clear()
    _failsafe._said.update(before)


def test_a_gpu_error_met_by_a_hook_is_said_in_one_line_and_not_as_our_failure(capsys) -> None:  # type: ignore[no-untyped-def]
    switch = Switch("silent-error checks")
    switch.fail(
        RuntimeError(
            "CUDA error: device-side assert triggered\nCUDA kernel errors might be "
            "asynchronously reported at some other API call"
        )
    )
    err = capsys.readouterr().err
    assert not switch.on
    assert err == (
        "torchdoctor: silent-error checks stopped: the GPU reported an error to it (CUDA "
        "error: device-side assert triggered); the training meets it at its next GPU call\n"
    )


def test_our_own_failure_is_said_as_one(capsys) -> None:  # type: ignore[no-untyped-def]
    Switch("telemetry").fail(KeyError("x"))
    assert "telemetry failed (KeyError: 'x') and was switched off" in capsys.readouterr().err


def test_kept_to_the_exit_is_never_freed() -> None:
    class Held:
        pass

    held = Held()
    ref = weakref.ref(held)
    keep_to_exit(held)
    del held
    gc.collect()
    assert ref() is not None


def test_first_line() -> None:
    assert first_line(RuntimeError("a\nb")) == "a"
    assert first_line(RuntimeError("")) == "RuntimeError"
