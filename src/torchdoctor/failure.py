"""Where an exception happened in a training process: the traceback's frames, the training
phase it ran in, the innermost module that raised (by its qualified name), the user's line,
and the line of the model's code that defines that module.

Shared by the out-of-memory capture (memory/oom.py) and the crash diagnosis (the session): both
read the live traceback while its frames still hold the module objects. torch is passed in,
never imported here.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import sys
import types
from typing import Any

from torchdoctor import frames as whose
from torchdoctor.views import TrainingView

BACKWARD_FILES = (
    os.sep.join(("torch", "autograd", "")),
    os.sep.join(("torch", "_tensor.py")),
    os.sep.join(("telemetry", "torch_hooks.py")),  # our wrapper of autograd.backward
)
BACKWARD_FUNCS = ("backward", "grad", "_engine_run_backward", "run_backward")


def frames_of(exc: BaseException) -> list[types.FrameType]:
    """The traceback's frames, outermost first."""
    out = []
    tb = exc.__traceback__
    while tb is not None:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def frame_locals(frame: types.FrameType) -> dict[str, Any]:
    try:
        return dict(frame.f_locals)
    except Exception:
        return {}


def first_arg(frame: types.FrameType) -> Any:
    code = frame.f_code
    if code.co_argcount < 1:
        return None
    return frame_locals(frame).get(code.co_varnames[0])


def phase_of(frames: list[types.FrameType], torch: Any) -> str | None:
    """The training phase the failing call ran in, from the outermost frame that tells."""
    module_cls, optim_cls = torch.nn.Module, torch.optim.Optimizer
    for frame in frames:
        code = frame.f_code
        path = code.co_filename
        if code.co_name in BACKWARD_FUNCS and any(p in path for p in BACKWARD_FILES):
            return "backward"
        owner = first_arg(frame)
        if isinstance(owner, optim_cls):
            return "optimizer"
        if isinstance(owner, module_cls):
            if code.co_name in ("_wrapped_call_impl", "_call_impl", "__call__", "forward"):
                return "forward"
            if code.co_name in ("to", "cuda", "_apply", "load_state_dict", "__init__"):
                return "setup"
        if os.sep.join(("torch", "utils", "data", "")) in path:
            return "data"
    return None


def _function_class(frame: types.FrameType) -> Any:
    """The custom autograd Function whose backward (or forward) this frame runs."""
    ctx = first_arg(frame)
    cls = getattr(type(ctx), "_forward_cls", None) if ctx is not None else None
    return cls if isinstance(cls, type) else None


def _code_names(code: types.CodeType, depth: int = 0) -> set[str]:
    names = set(code.co_names)
    if depth < 3:
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                names |= _code_names(const, depth + 1)
    return names


def _modules_using(fn_cls: type, candidates: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Modules whose forward code names the Function class (`MyFn.apply(x)`)."""
    out = []
    seen_types: dict[type, bool] = {}
    for name, module in candidates:
        kind = type(module)
        if kind not in seen_types:
            forward = getattr(kind, "forward", None)
            code = getattr(forward, "__code__", None)
            seen_types[kind] = code is not None and fn_cls.__name__ in _code_names(code)
        if seen_types[kind]:
            out.append((name, module))
    return out


def named_modules(training: TrainingView | None) -> list[tuple[str, Any]]:
    """(qualified name, module) of every module of the run's models."""
    out: list[tuple[str, Any]] = []
    if training is None:
        return out
    try:
        for root, _label in training.models.models():
            for _name, sub in root.named_modules():
                out.append((training.models.name_of(sub), sub))
    except Exception:
        pass
    return out


def module_name(module: Any, training: TrainingView | None) -> str:
    """The module's qualified name: from the run's models, else from the script's globals."""
    if training is not None:
        try:
            return str(training.models.name_of(module))
        except Exception:
            pass
    main = sys.modules.get("__main__")
    for key, value in list(vars(main).items()) if main is not None else []:
        try:
            if value is module:
                return key
            if hasattr(value, "named_modules"):
                for sub_name, sub in value.named_modules():
                    if sub is module:
                        return sub_name or key
        except Exception:
            continue
    return type(module).__name__


def locate(
    frames: list[types.FrameType], training: TrainingView | None, torch: Any
) -> dict[str, Any]:
    """The module that raised (or asked for the memory), and how sure that is: module,
    module_type, source, note, file, line; `function`/`candidates` for a custom autograd
    Function; `inputs`, the tensors its forward received (from the frame)."""
    module_cls = torch.nn.Module
    user = user_frame(frames)
    where: dict[str, Any] = {
        "module": None,
        "module_type": None,
        "source": None,
        "note": None,
        "file": user.f_code.co_filename if user else None,
        "line": user.f_lineno if user else None,
    }
    for frame in reversed(frames):
        owner = first_arg(frame)
        if isinstance(owner, module_cls):
            where.update(
                module=module_name(owner, training),
                module_type=type(owner).__name__,
                source="traceback",
                note="the innermost module in the traceback",
            )
            if not whose.is_torch(frame.f_code.co_filename):  # your module's code, else your line
                where.update(file=frame.f_code.co_filename, line=frame.f_lineno)
            where["object"] = owner
            forward = next(
                (f for f in frames if f.f_code.co_name == "forward" and first_arg(f) is owner),
                frame,
            )
            where["inputs"] = forward_inputs(forward, torch)
            return where
        fn_cls = _function_class(frame)
        if fn_cls is not None:
            users = _modules_using(fn_cls, named_modules(training))
            where.update(file=frame.f_code.co_filename, line=frame.f_lineno)
            where["function"] = fn_cls.__name__
            where["source"] = "autograd_function"
            if users:
                names = sorted({n for n, _m in users})
                where.update(module=names[0], module_type=type(users[0][1]).__name__)
                where["candidates"] = names
                many = f" (one of {len(names)}: {', '.join(names[:5])})" if len(names) > 1 else ""
                where["note"] = (
                    f"a guess: the backward of autograd Function {fn_cls.__name__} failed, and "
                    f"the forward of {type(users[0][1]).__name__} calls it{many}"
                )
            else:
                where["note"] = (
                    f"the backward of autograd Function {fn_cls.__name__} failed; no module's "
                    f"forward names it"
                )
            return where
    # Only an error raised inside backward() may be blamed on the module whose backward ran
    # last (an error in a helper after the step raised in none: dcgan's save_image on a GPU).
    in_backward = phase_of(frames, torch) == "backward"
    traced = training.last_traced_backward() if training is not None and in_backward else None
    if traced is not None:
        where.update(
            module=traced,
            source="traced_backward",
            note="a guess: the last module whose backward had started (traced step)",
        )
        return where
    if user is not None:
        where["source"] = "script_line"
        where["note"] = "no module frame in the traceback: the line of your code that failed"
    return where


@dataclasses.dataclass(kw_only=True)
class TensorInput:
    """A tensor a module's forward received: its argument name, shape, dtype and device."""

    name: str
    shape: list[int]
    dtype: str
    device: str


def forward_inputs(frame: types.FrameType, torch: Any) -> list[TensorInput]:
    """The tensors a module's forward frame received, by argument name (self left out)."""
    code = frame.f_code
    values = frame_locals(frame)
    count = code.co_argcount + code.co_kwonlyargcount
    out = []
    for name in code.co_varnames[1:count]:
        value = values.get(name)
        if isinstance(value, torch.Tensor):
            out.append(describe(name, value))
    return out


def describe(name: str, tensor: Any) -> TensorInput:
    return TensorInput(
        name=name,
        shape=list(tensor.shape),
        dtype=str(tensor.dtype).removeprefix("torch."),
        device=str(tensor.device),
    )


def user_frame(frames: list[types.FrameType]) -> types.FrameType | None:
    """The innermost frame of a traceback that runs the user's code (frames.user_frame)."""
    return whose.user_frame(frames[-1]) if frames else None


# -- the line that defines a module ------------------------------------------------------------
_IDENT = re.compile(r"^[A-Za-z_]\w*$")


@dataclasses.dataclass(kw_only=True)
class SourceLine:
    """A line of the user's code that makes something (a module, an optimizer); for a module,
    the attribute it assigns, the class whose __init__ does it and how the code refers to the
    module (`self.fc1`, `self.classifier[1]`)."""

    file: str
    line: int
    code: str
    attribute: str | None = None
    owner: str | None = None
    target: str | None = None

    @property
    def site(self) -> str:
        return f"{self.file}:{self.line}"


def definition(module: Any, training: TrainingView | None) -> SourceLine | None:
    """Where the model's code creates `module`: the `self.fc1 = nn.Linear(...)` line in its
    parent's __init__ (for a child of an nn.Sequential, the line creating the Sequential); None
    when the source cannot be read."""
    chain = _parents(module, training)
    for k, (parent, attr) in enumerate(chain):
        if not _IDENT.match(attr):
            continue  # a Sequential index: the line that builds the container holds it
        found = _assignment(type(parent), attr)
        if found is not None:
            below = [a for _p, a in reversed(chain[:k])]
            # how that code refers to the module: self.fc1, self.classifier[1]
            found.target = f"self.{attr}" + "".join(
                f"[{a}]" if a.isdigit() else f".{a}" for a in below
            )
            return found
    return None


def _parents(module: Any, training: TrainingView | None) -> list[tuple[Any, str]]:
    """(parent, attribute name) from the module up to the model."""
    parent_of: dict[int, tuple[Any, str]] = {}
    roots = []
    try:
        roots = [root for root, _l in training.models.models()] if training is not None else []
    except Exception:
        roots = []
    for root in roots:
        for _name, sub in root.named_modules():
            for attr, child in sub.named_children():
                parent_of.setdefault(id(child), (sub, attr))
    out: list[tuple[Any, str]] = []
    current = module
    while id(current) in parent_of and len(out) < 64:
        parent, attr = parent_of[id(current)]
        out.append((parent, attr))
        current = parent
    return out


def _assignment(cls: type, attr: str) -> SourceLine | None:
    pattern = re.compile(rf"\bself\.{re.escape(attr)}\s*(?::[^=]+)?=(?!=)")
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or not hasattr(init, "__code__"):
            continue
        path = init.__code__.co_filename
        if whose.is_torch(path) or path.startswith("<"):
            continue
        try:
            lines, start = inspect.getsourcelines(init)
        except (OSError, TypeError):
            continue
        for offset, text in enumerate(lines):
            if pattern.search(text):
                return SourceLine(
                    file=path,
                    line=start + offset,
                    code=text.strip(),
                    attribute=attr,
                    owner=klass.__name__,
                )
    return None


def optimizer_line(label: str, kind: str, files: list[str]) -> SourceLine | None:
    """Where the script makes its optimizer: the first line of `files` that assigns `label` a
    `kind(...)` (`optimizer = optim.Adam(`); None when no line of those files does (made
    elsewhere, or under another name)."""
    assign = re.compile(rf"(^|[^\w.]){re.escape(label)}\s*=\s*[\w.]*\b{re.escape(kind)}\(")
    for path in dict.fromkeys(files):
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for number, text in enumerate(lines, 1):
            if assign.search(text):
                return SourceLine(file=path, line=number, code=text.strip())
    return None
