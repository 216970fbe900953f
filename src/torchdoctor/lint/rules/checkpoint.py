"""TD7xx checkpoints."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from torchdoctor.lint.context import (
    FileContext,
    is_const,
    keyword,
    method,
    receiver,
    terminal,
    text,
)
from torchdoctor.lint.rule import Hit, Rule
from torchdoctor.lint.rules._patterns import optimizer_names


def _unsafe_load(ctx: FileContext) -> Iterator[Hit]:
    for n in ctx.nodes(ast.Call):
        assert isinstance(n, ast.Call)
        if ctx.call_name(n) == "torch.load" and is_const(keyword(n, "weights_only"), False):
            yield Hit(n)


UNSAFE_LOAD = Rule(
    code="TD701",
    name="torch-load-weights-only-false",
    message="torch.load(weights_only=False) unpickles arbitrary objects: it can run any code",
    what="torch.load called with weights_only=False.",
    why=(
        "With weights_only=False the file is unpickled without restrictions, and a pickle can "
        "execute arbitrary code while loading: a downloaded or shared checkpoint becomes a "
        "program. weights_only=True (the default since PyTorch 2.6) loads tensors and plain "
        "data only; classes you trust can be allow-listed."
    ),
    example='state = torch.load("ckpt.pt", weights_only=False)',
    fix=(
        'state = torch.load("ckpt.pt", map_location="cpu", weights_only=True)\n'
        "# objects you trust: torch.serialization.add_safe_globals([MyConfig])"
    ),
    check=_unsafe_load,
)

_OPTIMIZER_KEY = re.compile(r"(?i)optim")
_SCHEDULER_KEY = re.compile(r"(?i)sched")
_NOT_RESUME = re.compile(r"(?i)pretrain|finetune|eval|test|predict|infer|export|teacher")


def _saved_state(ctx: FileContext) -> set[str]:
    """What the file's torch.save() calls store besides the model: 'optimizer', 'scheduler'
    (by dict key or by the object whose state_dict() is saved)."""
    out: set[str] = set()
    optimizers = optimizer_names(ctx)
    for n in ctx.nodes(ast.Call):
        assert isinstance(n, ast.Call)
        if ctx.call_name(n) != "torch.save" or not n.args:
            continue
        saved = n.args[0]
        if isinstance(saved, ast.Name):  # state = {...}; torch.save(state, path)
            saved = ctx.value_before(ctx.scope(n), saved.id, n.lineno) or saved
        for node in ast.walk(saved):
            words: list[str] = []
            if isinstance(node, ast.Dict):
                words = [
                    k.value
                    for k in node.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                ]
            elif isinstance(node, ast.Call) and method(node) == "state_dict":
                words = [terminal(receiver(node)) or ""]
            for w in words:
                if _OPTIMIZER_KEY.search(w) or w in optimizers:
                    out.add("optimizer")
                elif _SCHEDULER_KEY.search(w):
                    out.add("scheduler")
    return out


def _restored(ctx: FileContext) -> set[str]:
    out: set[str] = set()
    optimizers = optimizer_names(ctx)
    for n in ctx.nodes(ast.Call):
        assert isinstance(n, ast.Call)
        if method(n) != "load_state_dict":
            continue
        owner = terminal(receiver(n)) or ""
        if owner in optimizers or _OPTIMIZER_KEY.search(owner):
            out.add("optimizer")
        elif _SCHEDULER_KEY.search(owner):
            out.add("scheduler")
        else:
            # load_state_dict of an object passed the checkpoint's optimizer entry.
            for a in ast.walk(n):
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    if _OPTIMIZER_KEY.search(a.value):
                        out.add("optimizer")
                    elif _SCHEDULER_KEY.search(a.value):
                        out.add("scheduler")
    return out


def _loaded_checkpoint(ctx: FileContext, call: ast.Call) -> bool:
    """model.load_state_dict(x) where x comes from torch.load in the same scope."""
    if not call.args:
        return False
    arg = call.args[0]
    scope = ctx.scope(call)
    for _ in range(3):
        if isinstance(arg, ast.Subscript):
            arg = arg.value
        elif isinstance(arg, ast.Name):
            value = ctx.value_before(scope, arg.id, call.lineno)
            if value is None:
                return False
            arg = value
        else:
            break
    return isinstance(arg, ast.Call) and ctx.call_name(arg) == "torch.load"


def _resume_without_optimizer(ctx: FileContext) -> Iterator[Hit]:
    saved = _saved_state(ctx)
    if not saved or not optimizer_names(ctx):
        return
    missing = sorted(saved - _restored(ctx))
    if not missing:
        return
    for n in ctx.nodes(ast.Call):
        assert isinstance(n, ast.Call)
        if method(n) != "load_state_dict" or not _loaded_checkpoint(ctx, n):
            continue
        scope = ctx.scope(n)
        context = [text(n), getattr(scope, "name", "")]
        if any(_NOT_RESUME.search(c) for c in context):
            continue
        what = " and ".join(missing)
        yield Hit(
            n,
            f"resume restores the model but not the {what} that the checkpoints of this "
            f"file save: training restarts with a fresh {what} state; load it too",
        )
        return


RESUME_WITHOUT_OPTIMIZER = Rule(
    code="TD702",
    name="resume-without-optimizer-state",
    message="resume restores the model but not the optimizer/scheduler state it saved",
    what=(
        "A file whose torch.save() stores the optimizer's (or the scheduler's) state with "
        "the model, and which loads a checkpoint into the model with load_state_dict but "
        "never calls load_state_dict on the optimizer (or scheduler). Loading pretrained "
        "weights to fine-tune, evaluate or export is not reported."
    ),
    why=(
        "Adam's moment estimates (and SGD's momentum) start from zero again, which acts "
        "like a sudden large learning rate: the loss jumps right after the resume. A "
        "scheduler not restored restarts its schedule (warm-up included), so the learning "
        "rate no longer matches the epoch. The resumed run is not the run that was saved."
    ),
    example=(
        "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)\n"
        'torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)\n'
        "...\n"
        "ckpt = torch.load(path)\n"
        'model.load_state_dict(ckpt["model"])'
    ),
    fix=(
        "optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)\n"
        'torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)\n'
        "...\n"
        "ckpt = torch.load(path)\n"
        'model.load_state_dict(ckpt["model"])\n'
        'optimizer.load_state_dict(ckpt["optimizer"])'
    ),
    check=_resume_without_optimizer,
)

RULES = (UNSAFE_LOAD, RESUME_WITHOUT_OPTIMIZER)
