"""Names from the wild as the data set records them.

File and folder names are bytes on Linux; Python hands undecodable ones over with
surrogate escapes (PEP 383), which no UTF-8 JSON, TSV or manifest can hold. Such a name is
still opened by its real bytes, and recorded escaped: each undecodable byte as ``\\xNN``,
and so are control characters (NUL, tabs, newlines), which would break a TSV line or a
terminal. A valid, printable name is recorded as it is.
"""
from __future__ import annotations

import os
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Integer labels of a list (CSV/TSV or JSON Lines) define classes "0".."max": beyond this a
# label is a typo or an attack (a label of 10**12 must not make 10**12 class names): a reject.
MAX_LIST_LABEL = 2**20
# A path a list or a COCO file names, and a class name it gives, longer than any file path
# (Linux PATH_MAX) or class name can be is a reject; what a manifest records of a reject (its
# path and reason) is clipped, so its rejects never grow it past what a reader takes.
MAX_PATH_CHARS = 4096
MAX_CLASS_CHARS = 1024
MAX_REJECT_CHARS = 2048


def shown(name: str) -> str:
    """``name`` as the manifest, shard metadata and rejects record it (see module doc)."""
    try:
        name.encode("utf-8")
        clean = True
    except UnicodeEncodeError:
        clean = False
    if clean and not _CONTROL.search(name):
        return name
    if not clean:
        name = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", name)


def clipped(text: str, limit: int = MAX_REJECT_CHARS) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def too_long(text: str, what: str, limit: int) -> str | None:
    """Why ``text`` (a path or a class name) cannot be one, or None."""
    return None if len(text) <= limit else \
        f"{what} of {len(text)} characters, more than the {limit} one may have"


def hashable(name: str) -> bytes:
    """``name``'s real bytes (for digests): undecodable ones kept as they were on disk."""
    return name.encode("utf-8", "surrogateescape")


def field_name(key: str) -> str:
    """A field name made of a key from another format (a tar member's suffix, a TFRecord
    feature, a Parquet column): every character that cannot be in a name becomes "_",
    at most 64 of them, "_" first when it starts with a digit; a name the sample already
    has (image, label, index) gets a "_" after it."""
    name = re.sub(r"\W", "_", key, flags=re.ASCII)[:64] or "_"
    name = name if re.match(r"[A-Za-z_]", name) else "_" + name[:63]
    return name + "_" if name in ("image", "label", "index") else name


def link_counts(root: str, paths) -> tuple[int, int]:
    """(inputs reached through a symlink, of them those whose real path lies outside
    ``root``) of ``paths`` relative to ``root``, counted as the folder scan counts its own:
    what a list or a COCO file names is followed like a folder's entries, and said. Each
    folder's real path is resolved once."""
    real_root, folders = os.path.realpath(root), {}
    via = outside = 0
    for rel in paths:
        try:
            head, name = os.path.split(rel)
            if head not in folders:
                real = os.path.realpath(os.path.join(root, head))
                folders[head] = real, real != os.path.normpath(os.path.join(real_root, head))
            folder, linked = folders[head]
            path = os.path.join(folder, name)
            if not (linked or os.path.islink(path)):
                continue
            real = os.path.realpath(path)
        except (OSError, ValueError):  # a NUL in the path: a reject already
            continue
        via += 1
        outside += not real.startswith(real_root + os.sep)
    return via, outside
