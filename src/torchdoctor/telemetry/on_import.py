"""Run a callback once a module has been imported, without importing it ourselves.

`TORCHDOCTOR=1` starts the probe at interpreter start-up; the torch hooks wait until the
script imports torch, so processes that never use torch pay nothing for it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, done: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._done = done

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._done(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callback) -> None:
        self.name = name
        self.callback = callback
        self._searching = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or getattr(self._searching, "on", False):
            return None
        self._searching.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._searching.on = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, self._fire)
        return spec

    def _fire(self, module: ModuleType) -> None:
        self.remove()
        self.callback(module)

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


def _initializing(module: ModuleType) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def when_imported(name: str, callback: Callback) -> Callable[[], None]:
    """Call `callback(module)` now if `name` is imported, else right after its import.

    Returns a function that cancels the wait.
    """
    module = sys.modules.get(name)
    if module is not None and _initializing(module):
        # Imported halfway (we were attached while the script was importing it): wait for
        # the import to finish on a side thread rather than touch a half-built module.
        cancelled = threading.Event()

        def wait() -> None:
            while _initializing(module) and not cancelled.wait(0.05):
                pass
            if not cancelled.is_set():
                callback(module)

        threading.Thread(target=wait, name="torchdoctor-wait-import", daemon=True).start()
        return cancelled.set
    if module is not None:
        callback(module)
        return lambda: None
    finder = _Finder(name, callback)
    sys.meta_path.insert(0, finder)
    return finder.remove
