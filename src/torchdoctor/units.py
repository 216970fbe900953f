"""Byte counts in and out of the units PyTorch prints ("2.00 GiB", "145.81 MiB", "512 bytes").

One module for every part of torchdoctor: error messages, OOM reports, the status line. KB, MB
and GB are read as binary units, as PyTorch's allocator computes them."""

from __future__ import annotations

import re

_SCALE = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 1024,
    "kib": 1024,
    "mb": 1024**2,
    "mib": 1024**2,
    "gb": 1024**3,
    "gib": 1024**3,
    "tb": 1024**4,
    "tib": 1024**4,
}
# A size inside a longer text, as PyTorch, NumPy and the MPS backend print it.
SIZE = r"\d+(?:\.\d+)?\s*(?:[KMGT]i?B|bytes?|B)\b"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|bytes?|B)?\s*$", re.IGNORECASE)


def human(n: float | None) -> str:
    """1536 -> '1.50 KiB' (binary units, as the allocator prints them)."""
    if n is None:
        return "?"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} bytes"


def parse_size(text: str) -> int:
    """'2.00 GiB' -> 2147483648; '300M' and '300MB' mean MiB; a bare number is bytes.
    Raises ValueError for anything else."""
    t = text.strip()
    if t and t[-1] in "KMGTkmgt":
        t += "iB"
    m = _SIZE.match(t)
    if m is None:
        raise ValueError(f"not a size: {text!r} (try 512MiB, 2GiB, 300M)")
    unit = (m.group(2) or "b").lower()
    return round(float(m.group(1)) * _SCALE[unit])


def size_in(text: str) -> int | None:
    """The first size inside a longer text ('Tried to allocate 20.00 MiB.'), or None."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B|bytes?|B)\b", text, re.IGNORECASE)
    if m is None:
        return None
    return round(float(m.group(1)) * _SCALE[m.group(2).lower()])
