"""Secrets kept out of every command line torchdoctor writes or shows (meta.json, the
registry entry, /v1/status, `torchdoctor list`): the value of `--token` (and of any
`--*-token`, `--*secret*`, `--*password*`, `--*api-key*` flag, the script's own included),
`TORCHDOCTOR_TOKEN=...`, and any secret the caller knows by value.

Run directories and registry entries are private to the user, but they get copied, attached to
bug reports and shown on screens: a command line is not a place for a credential.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

MASK = "***"

# A long option whose value is a secret: --token, --hf-token, --api_key, --db-password, ...
_SECRET_FLAG = re.compile(
    r"^--[A-Za-z0-9_-]*(token|secret|passw(or)?d|api[-_]?key)$", re.IGNORECASE
)
# NAME=value for the environment variables that hold secrets (`env TORCHDOCTOR_TOKEN=x ...`).
_SECRET_ASSIGNMENT = re.compile(
    r"\b((?:[A-Z0-9_]*_)?(?:TOKEN|SECRET|PASSWORD|API_KEY))=\S*", re.IGNORECASE
)
_MIN_SECRET = 4  # shorter known values are not searched for: they would mask ordinary text


def redact_argv(argv: Sequence[str], secrets: Iterable[str | None] = ()) -> list[str]:
    """A copy of `argv` with secret values replaced by `***`."""
    known = sorted({s for s in secrets if s and len(s) >= _MIN_SECRET}, key=len, reverse=True)
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        name, eq, _value = arg.partition("=")
        if _SECRET_FLAG.match(name):
            if eq:
                out.append(f"{name}={MASK}")
            else:
                out.append(arg)
                mask_next = True
            continue
        out.append(redact_text(arg, known))
    return out


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """`text` with NAME=value secrets and the known secret values masked."""
    text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m.group(1)}={MASK}", text)
    for secret in secrets:
        if secret and len(secret) >= _MIN_SECRET:
            text = text.replace(secret, MASK)
    return text


def command_line(argv: Sequence[str] | None) -> str:
    """A command line for display, redacted (entries written by older versions were not)."""
    return " ".join(redact_argv(list(argv or [])))
