"""A call that torchdoctor's TorchFunctionModes make for the script is, to warnings and to the
tracebacks torchdoctor prints, the script's own call (telemetry/as_caller.py)."""

from __future__ import annotations

import sys
import traceback
import warnings

from torchdoctor.frames import drop_own_frames
from torchdoctor.telemetry.as_caller import call_as_caller


def _warns() -> None:
    warnings.warn("from the callee, naming its caller", stacklevel=2)


def _raises() -> None:
    raise ValueError("from the callee")


def test_a_warning_names_the_callers_file_and_line() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1  # the next line's
        call_as_caller(sys._getframe(), _warns, (), {})
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]


def test_the_call_leaves_no_frame_in_a_printed_traceback() -> None:
    try:
        call_as_caller(sys._getframe(), _raises, (), {})
    except ValueError as exc:
        raw = [f.name for f in traceback.extract_tb(exc.__traceback__)]
        shown = [f.name for f in traceback.extract_tb(drop_own_frames(exc.__traceback__))]
    name = "test_the_call_leaves_no_frame_in_a_printed_traceback"
    assert raw == [name, "call_as_caller", name, "_raises"]  # the moved frame, under our name
    assert shown == [name, "_raises"]
