"""A run's digest rendered by name: `html` (the self-contained page) or `json` (the digest
itself, for scripts); with `report --baseline`, the comparison beside it (the page's
"Compared with" section; the JSON's `comparison`, as `torchdoctor compare --format json`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torchdoctor._json import dumps
from torchdoctor.digest.record import Digest
from torchdoctor.report import html

if TYPE_CHECKING:
    from torchdoctor.compare.record import Comparison


def to_json(digest: Digest, comparison: Comparison | None = None) -> str:
    if comparison is None:
        return dumps(digest, indent=1)
    return dumps({**digest.to_json(), "comparison": comparison}, indent=1)


RENDERERS: dict[str, Callable[[Digest, Comparison | None], str]] = {
    "html": html.render,
    "json": to_json,
}


def render(digest: Digest, fmt: str = "html", comparison: Comparison | None = None) -> str:
    return RENDERERS[fmt](digest, comparison)
