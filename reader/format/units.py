"""Byte counts written by people: ``256MB``, ``1.5GiB``, ``4096`` (shard sizes, cache limits).

Decimal units (KB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB...) powers of 1024.
It lives in the reader because both the packer (--shard-size) and the reader (cache_limit)
parse sizes, and the reader never imports the packer.
"""
from __future__ import annotations

import re

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def parse_size(text) -> int:
    """Parse a byte count such as ``256MB``, ``1.5GiB`` or ``4096`` into an int."""
    if isinstance(text, int):
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"shard size {text!r} is not a size such as 256MB, 1GiB or 4096")
    unit = (match.group(2) or "").upper().rstrip("B")
    return int(float(match.group(1)) * _UNITS[unit])
