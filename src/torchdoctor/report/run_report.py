"""A run's digest rendered by name: `html` (the self-contained page) or `json` (the digest
itself, for scripts)."""

from __future__ import annotations

from collections.abc import Callable

from torchdoctor._json import dumps
from torchdoctor.digest.record import Digest
from torchdoctor.report import html


def to_json(digest: Digest) -> str:
    return dumps(digest, indent=1)


RENDERERS: dict[str, Callable[[Digest], str]] = {"html": html.render, "json": to_json}


def render(digest: Digest, fmt: str = "html") -> str:
    return RENDERERS[fmt](digest)
