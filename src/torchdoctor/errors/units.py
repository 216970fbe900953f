"""Byte sizes as error messages print them ("2.00 GiB", "145.81 MiB", "0 bytes", "1.5 GB")."""

from __future__ import annotations

import re

_UNITS = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

# A size as PyTorch, NumPy and the MPS backend print it.
SIZE = r"\d+(?:\.\d+)?\s*(?:[KMGT]i?B|bytes?|B)\b"
_SIZE_RX = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]i?B|bytes?|B)\b", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """'2.00 GiB' -> 2147483648; None when the text holds no size. PyTorch's KB/MB/GB in the
    MPS message are binary units, as in the caching allocator's own arithmetic."""
    m = _SIZE_RX.search(text)
    if m is None:
        return None
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit in ("kb", "mb", "gb", "tb"):
        unit = unit[0] + "ib"
    return round(number * _UNITS[unit])


def human(n: float) -> str:
    """Bytes in the units the allocator uses: 1536 -> '1.50 KiB'."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} bytes"
