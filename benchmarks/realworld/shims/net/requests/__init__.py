"""A stand-in for requests, for programs that check it is installed before looking for a
file they would download (lightning.pytorch.demos.WikiText2): the data is already there, so
nothing is fetched; a request would be a mistake of the harness and says so."""

from __future__ import annotations

from typing import Any

__version__ = "0.0.0+realworld-shim"


def get(url: str, *args: Any, **kwargs: Any) -> Any:
    raise ConnectionError(f"realworld shim: no network; the data for {url} should be in place")
