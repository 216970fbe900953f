"""A torch function that torchdoctor intercepts is called as if from its own caller.

A TorchFunctionMode of ours (the dropout watch of an eval call, the NaN replay) sees a torch
function and calls it from `__torch_function__`: between the call and its caller now stand
torch's dispatch frames and ours. Warnings are placed by frames: one that torch gives with
`stacklevel=2` (F.dropout2d on a 2-D input), or from C++ (the innermost Python frame), would
name torchdoctor's file, and, its location being new, Python would show it again where the
script's own call had shown it once already. pytorch/examples' mnist_rnn printed its dropout2d
warning twice under torchdoctor.

`call_as_caller` makes the call from a frame that warnings take for the caller's: the caller's
file, line, function name and module globals (its `__warningregistry__`, so once per location
counts both as one).
"""

from __future__ import annotations

import os
import sys
from types import CodeType, FunctionType
from typing import TYPE_CHECKING, Any

from torchdoctor.frames import AS_CALLER

if TYPE_CHECKING:
    from types import FrameType

_OVERRIDES = os.path.join("torch", "overrides.py")  # torch's handle_torch_function
_CACHED = 4096


def _call(func: Any, args: Any, kwargs: Any) -> Any:
    """(frames.AS_CALLER, set below: a traceback drops this frame as one of ours)"""
    return func(*args, **kwargs)


_call.__code__ = _call.__code__.replace(co_consts=(AS_CALLER, *_call.__code__.co_consts[1:]))


# how far _call's calling line is from its first line: _code_at moves it to the caller's
_CALL_LINE = max(line for _start, _end, line in _call.__code__.co_lines() if line is not None)
_OFFSET = _CALL_LINE - _call.__code__.co_firstlineno


_codes: dict[tuple[CodeType, int], CodeType] = {}


def call_as_caller(frame: FrameType | None, func: Any, args: Any, kwargs: Any) -> Any:
    """`func(*args, **kwargs)` as called from the frame that called `func` through torch's
    function dispatch; `frame` is the caller of `__torch_function__`."""
    caller = dispatch_caller(frame, func)
    if caller is None:
        return func(*args, **kwargs)
    call: Any = FunctionType(_code_at(caller), caller.f_globals)
    return call(func, args, kwargs)


def dispatch_caller(frame: FrameType | None, func: Any) -> FrameType | None:
    """The frame that called `func`: past torch's dispatch (overrides.py) and the frame of a
    Python function that handed itself to it (`if has_torch_function(...)`)."""
    own = getattr(func, "__code__", None)
    while frame is not None and (
        frame.f_code is own or frame.f_code.co_filename.endswith(_OVERRIDES)
    ):
        frame = frame.f_back
    return frame


def _code_at(caller: FrameType) -> CodeType:
    """_call's code, moved to the caller's file and line, under the caller's name."""
    key = (caller.f_code, caller.f_lineno)
    code = _codes.get(key)
    if code is None:
        where: dict[str, Any] = {
            "co_filename": caller.f_code.co_filename,
            "co_name": caller.f_code.co_name,
            # the line of _call's call becomes the caller's
            "co_firstlineno": max(caller.f_lineno - _OFFSET, 1),
        }
        if sys.version_info >= (3, 11):
            where["co_qualname"] = caller.f_code.co_qualname
        code = _call.__code__.replace(**where)
        if len(_codes) >= _CACHED:
            _codes.clear()
        _codes[key] = code
    return code
