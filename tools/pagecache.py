"""Warm the page cache before a timed run.

This machine's kernel evicts file pages left idle for about 30 s, so every "warm cache"
measurement re-reads its files (untimed) right before it starts.
"""
from __future__ import annotations

import os


def warm(*paths) -> None:
    """Read every file at or below each of ``paths`` (files or folders) once, untimed."""
    for root in paths:
        root = os.fspath(root)
        if os.path.isfile(root):
            _read(root)
            continue
        for dirpath, _, files in os.walk(root):
            for name in files:
                _read(os.path.join(dirpath, name))


def _read(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 22):
            pass
