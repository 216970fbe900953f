"""A stand-in for torchvision (the PyPI wheel does not import beside this torch): only what
the real-world programs of benchmarks/realworld.py use, on synthetic data. Never downloads."""

from . import datasets, models, transforms, utils

__all__ = ["datasets", "models", "transforms", "utils"]
__version__ = "0.0.0+realworld-shim"
