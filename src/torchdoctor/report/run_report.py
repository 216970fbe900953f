"""A run's digest rendered by name: `html` (the self-contained page) or `json` (the digest
itself, for scripts)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchdoctor._json import dumps
from torchdoctor.report import html


def to_json(digest: dict[str, Any]) -> str:
    return dumps(digest, indent=1)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {"html": html.render, "json": to_json}


def render(digest: dict[str, Any], fmt: str = "html") -> str:
    return RENDERERS[fmt](digest)
