"""What the overfit and repro modes share: ending the script after N steps, and the depth of
module calls (which calls are the model's, which a loss module's)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from torchdoctor.telemetry.invisible import compiling

if TYPE_CHECKING:
    from torchdoctor.telemetry.patches import Hooks


class StopTraining(BaseException):
    """Raised at the end of the last step the recipe wanted: unwinds the script from inside
    its training loop (its `finally` blocks and `with` exits run; its code after the loop
    does not). A BaseException, so the script's `except Exception` does not swallow it."""


class Depth:
    """Nesting of module calls on the training thread (global forward pre/post hooks)."""

    def __init__(self, torch: Any, hooks: Hooks) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        self.level = 0
        self.thread = threading.main_thread().ident
        # callbacks(module, args) -> new args or None, for the outermost calls (models, loss
        # modules); global pre-hooks see positional arguments only
        self.on_root: list[Any] = []

        def pre(module: Any, args: Any) -> Any:
            if compiling() or threading.get_ident() != self.thread:
                return None
            result = None
            if self.level == 0:
                for callback in self.on_root:
                    changed = callback(module, args)
                    if changed is not None:
                        args = result = changed
            self.level += 1
            return result

        def post(module: Any, args: Any, output: Any) -> None:
            if compiling() or threading.get_ident() != self.thread:
                return
            self.level = max(0, self.level - 1)

        hooks.handle(register_module_forward_pre_hook(pre))
        hooks.handle(register_module_forward_hook(post, always_call=True))
