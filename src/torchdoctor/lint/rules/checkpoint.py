"""TD7xx checkpoints."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from torchdoctor.lint.context import FileContext, Hit, is_const, keyword
from torchdoctor.lint.engine import Rule


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

RULES = (UNSAFE_LOAD,)
