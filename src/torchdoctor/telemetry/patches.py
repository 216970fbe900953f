"""Hooks that can always be removed: monkeypatches and torch hook handles, kept in one list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# A wrapper of ours names what it wraps here (see unpatched).
ORIGINAL = "__torchdoctor_original__"


def unpatched(value: Any) -> Any:
    """`value` without the wrappers of ours around it. A forked child that starts a probe of
    its own (a forked rank, torchdoctor.start() in a child) still has its parent's wrappers in
    place, switched off: it wraps what they wrap, and reads the original's code, not theirs."""
    # read from the object's own __dict__: a __getattr__ that answers any name is never asked
    while (inner := (getattr(value, "__dict__", None) or {}).get(ORIGINAL)) is not None:
        value = inner
    return value


class Hooks:
    """Every handle and patch torchdoctor installed, removed together in reverse order.

    Each entry is its undo and, where it is only attribute and dict changes, the same undo as
    safe in a forked child (see remove_in_fork); a callback's undo has none."""

    def __init__(self) -> None:
        self._undo: list[tuple[Callable[[], None], Callable[[], None] | None]] = []

    def patch(self, owner: Any, name: str, replacement: Any) -> Any:
        """Replace owner.name, keeping the original for restore; returns the original. On a
        class that only inherits `name`, the restore deletes the class's own attribute."""
        if isinstance(owner, type) and name not in owner.__dict__:
            setattr(owner, name, replacement)
            self._pure(lambda: delattr(owner, name))
            return getattr(super(owner, owner), name, None)
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, replacement)
        self._pure(lambda: setattr(owner, name, original))
        return original

    def handle(self, handle: Any) -> Any:
        """A torch RemovableHandle: its remove() deletes the hook from torch's dict."""
        self._pure(handle.remove)
        return handle

    def replace(self, handle: Any, hook: Any) -> None:
        """Put `hook` in the place of the hook `handle` removes: the same dict (torch keeps a
        module's or the global hooks as handle id -> hook), the same place in it, its options
        (with_kwargs, always_call: kept by the id) unchanged."""
        hooks = handle.hooks_dict_ref()
        if hooks is not None and handle.id in hooks:
            hooks[handle.id] = hook

    def on_remove(self, fn: Callable[[], None]) -> None:
        """A callback at removal (threads to stop, state to restore): not run in a fork."""
        self._undo.append((fn, None))

    def nest(self, other: Hooks, undo: Callable[[], None] | None = None) -> None:
        """`other`'s hooks come off with these: through `undo` (default `other.remove`), and
        in a forked child through `other.remove_in_fork`."""
        self._undo.append((undo or other.remove, other.remove_in_fork))

    def remove(self) -> None:
        self._unwind(in_fork=False)

    def remove_in_fork(self) -> None:
        """In a forked child, whose session is not its own: the patches and torch hooks come
        off, so that the child runs at its plain speed (a trainer forked from a probed process,
        mnist_hogwild's way) and a probe it starts installs on torch as it was. Only attribute
        and dict changes run: a lock that another thread of the parent held at the fork stays
        held in the child, so the callbacks (threads, signal handlers, the collectives kernel)
        are left, switched off."""
        self._unwind(in_fork=True)

    def _unwind(self, in_fork: bool) -> None:
        while self._undo:
            undo, in_child = self._undo.pop()
            step = in_child if in_fork else undo
            if step is None:
                continue
            try:
                step()
            except Exception:
                pass

    def _pure(self, undo: Callable[[], None]) -> None:
        self._undo.append((undo, undo))

    def __len__(self) -> int:
        return len(self._undo)
