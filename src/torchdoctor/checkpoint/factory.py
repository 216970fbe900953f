"""`--model PATH.py:FACTORY`: the user's model, built by code the user chose to run.

The file is imported as a module (its directory first on sys.path, so its own imports work)
and FACTORY is called without arguments: a function returning the nn.Module, or the module
class itself. This runs the user's code, as `python PATH.py` would; the checkpoint's code
never runs.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any


class FactoryError(Exception):
    """--model does not give a model; the message says why."""


def parse(spec: str) -> tuple[Path, str]:
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise FactoryError(f"--model takes PATH.py:FACTORY (e.g. model.py:build), not {spec!r}")
    return Path(path), name


def load(spec: str) -> Any:
    """The nn.Module that FACTORY in PATH.py returns."""
    import torch

    path, name = parse(spec)
    if not path.is_file():
        raise FactoryError(f"--model: no such file: {path}")
    module_name = f"torchdoctor_model_{abs(hash(str(path.resolve())))}"
    spec_ = importlib.util.spec_from_file_location(module_name, path)
    if spec_ is None or spec_.loader is None:
        raise FactoryError(f"--model: cannot import {path}")
    module = importlib.util.module_from_spec(spec_)
    sys.modules[module_name] = module
    sys.path.insert(0, str(path.resolve().parent))
    try:
        spec_.loader.exec_module(module)
    except BaseException as exc:
        raise FactoryError(
            f"--model: importing {path} failed: {type(exc).__name__}: {exc}"
        ) from None
    finally:
        sys.path.remove(str(path.resolve().parent))
    factory: Any = module
    for part in name.split("."):
        if not hasattr(factory, part):
            raise FactoryError(f"--model: {path} has no {name!r}")
        factory = getattr(factory, part)
    try:
        model = factory() if callable(factory) else factory
    except BaseException as exc:
        raise FactoryError(f"--model: {name}() failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise FactoryError(f"--model: {name} returned {type(model).__name__}, not an nn.Module")
    return model
