"""Hugging Face `generate()` returning more new tokens than the `max_new_tokens` it was asked for
(TrainCheck's transformers-23723: Whisper's generate() raised `max_new_tokens` by the length of
the prompt before trimming the prompt to fit the context, so the limit it passed on was larger
than the one asked for).

Only where the script imports transformers' generation code (`transformers.generation.utils`,
waited for, never imported here): `GenerationMixin.generate` is wrapped, and so is the
`generate` of every subclass that defines its own (those defined later too, through
`GenerationMixin.__init_subclass__`): the limit that counts is the one the caller asked for, and
a model's own generate() may change it before it calls the mixin's. Only the outermost call is
looked at (a subclass's generate calls super().generate()).

The request: `max_new_tokens` from the call, else from the `generation_config` passed, else
(none passed) from the model's. The prompt: the `input_ids` passed (their length; none with
`inputs_embeds` alone, whose output holds only the new tokens). Encoder-decoder models are left
out: the tokens their own generate() puts before the decoder's output (Whisper's language and
task tokens) are not told apart from generated ones. A call whose `sequences` are longer than
prompt + max_new_tokens is written as `silent.max_new_tokens` (once per line that called it).
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import TYPE_CHECKING, Any

from torchdoctor.frames import site, user_frame
from torchdoctor.telemetry.invisible import skip_own_frames
from torchdoctor.telemetry.on_import import when_imported

if TYPE_CHECKING:
    from types import FrameType

    from torchdoctor.telemetry.patches import Hooks

MODULE = "transformers.generation.utils"


class Generations:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.depth = 0  # generate() calls in progress on the training thread

    def install(self, hooks: Hooks) -> None:
        def imported(module: Any) -> None:
            try:
                self._patch(hooks, module)
            except Exception as exc:
                self.host.fail(exc)

        hooks.on_remove(when_imported(MODULE, imported))

    def _patch(self, hooks: Hooks, module: Any) -> None:
        from torchdoctor.telemetry.silent.hooks import thread_check

        mixin = getattr(module, "GenerationMixin", None)
        if mixin is None or not self.host.switch.on:
            return
        on = thread_check(self.host)
        wrapped: set[int] = set()

        def wrap(cls: type) -> None:
            original = cls.__dict__.get("generate")
            if not inspect.isfunction(original) or id(cls) in wrapped:
                return
            wrapped.add(id(cls))
            wrapper = self._wrap(original, on)
            hooks.patch(cls, "generate", wrapper)
            skip_own_frames(wrapper)

        wrap(mixin)
        for cls in _subclasses(mixin):
            wrap(cls)

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            super(mixin, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
            if "generate" in cls.__dict__ and self.host.switch.on:
                try:
                    wrap(cls)
                except Exception as exc:
                    self.host.fail(exc)

        hooks.patch(mixin, "__init_subclass__", classmethod(__init_subclass__))

    def _wrap(self, original: Any, on: Any) -> Any:
        generations = self

        @functools.wraps(original)
        def generate(model: Any, *args: Any, **kwargs: Any) -> Any:
            if generations.depth or not on():
                return original(model, *args, **kwargs)
            generations.depth += 1
            try:
                out = original(model, *args, **kwargs)
            finally:
                generations.depth -= 1
            try:
                generations.check(model, args, kwargs, out, sys._getframe(1))
            except Exception as exc:
                generations.host.fail(exc)
            return out

        return generate

    def check(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
              frame: FrameType) -> None:  # fmt: skip
        torch = self.host.torch
        config = getattr(model, "config", None)
        if getattr(config, "is_encoder_decoder", False):
            return
        limit = _max_new_tokens(model, args, kwargs)
        sequences = out if isinstance(out, torch.Tensor) else getattr(out, "sequences", None)
        if not isinstance(limit, int) or not isinstance(sequences, torch.Tensor):
            return
        prompt_ids = kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))
        if isinstance(prompt_ids, torch.Tensor) and prompt_ids.dim() == 2:
            prompt = int(prompt_ids.shape[-1])
        elif prompt_ids is None and kwargs.get("inputs_embeds") is not None:
            prompt = 0
        else:
            return
        length = int(sequences.shape[-1])
        if length - prompt <= limit:
            return
        where = site(user_frame(frame))
        data = {
            "step": self.host.rec.step,
            "site": where,
            "model": type(model).__name__,
            "max_new_tokens": limit,
            "prompt": prompt,
            "length": length,
            "new_tokens": length - prompt,
        }
        self.host.emit("max_new_tokens", data, key=where)


def _max_new_tokens(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if kwargs.get("max_new_tokens") is not None:
        return kwargs["max_new_tokens"]
    # A generation config passed in is the one read (what transformers merges into it from
    # the model's is left alone: a limit it may not use is no limit to hold it to).
    config = kwargs.get("generation_config", args[1] if len(args) > 1 else None)
    if config is None:
        config = getattr(model, "generation_config", None)
    return getattr(config, "max_new_tokens", None)


def _subclasses(cls: type) -> list[type]:
    out: list[type] = []
    todo: list[type] = list(cls.__subclasses__())
    while todo:
        sub = todo.pop()
        if sub not in out:
            out.append(sub)
            todo.extend(sub.__subclasses__())
    return out
