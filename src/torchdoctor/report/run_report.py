"""A run's digest rendered by name: `html` (the self-contained page) or `json` (the digest
itself, for scripts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from torchdoctor.report import html


def to_json(digest: dict[str, Any]) -> str:
    return json.dumps(digest, indent=1, allow_nan=False, default=str)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {"html": html.render, "json": to_json}


def render(digest: dict[str, Any], fmt: str = "html") -> str:
    return RENDERERS[fmt](digest)
