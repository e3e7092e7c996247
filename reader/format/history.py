"""What a data set records about its inputs' identity and its appends (format 2 and 3
alike: both are optional keys that older readers ignore).

* Shard metadata ``"sources"``: beside ``"paths"``, the SHA-256 (hex) of every record's
  input file, in record order. ``dlpack convert --append`` compares (path, hash) with the
  files of SRC to pack only what is new. Shards packed before it was recorded lack it.
* Manifest ``"history"``: one entry per append, oldest first: when (``at``), from where
  (``source``), what it saw (``inputs``: the inputs it packed or rejected; ``duplicates``,
  ``changed``, ``unverified``: those it skipped; ``replaced``, optional: of the changed,
  those packed to retire their old record, reader/format/retired.py; ``retried``,
  optional: rejects of earlier runs whose input it tried again, dropped from ``rejects``
  and from ``source.num_inputs`` since this run's outcome replaces them), the samples it added (``first_sample``,
  ``num_samples``), the classes it added (``new_classes``) and the shards it wrote
  (``shards``). Covered by the manifest checksum like every other key.
"""
from __future__ import annotations

import re

from dlpack_io.reader.format.spec import MAX_JSON_INT, FormatError

SOURCES_KEY = "sources"
HISTORY_KEY = "history"
SHA256_RE = re.compile(r"[0-9a-f]{64}")  # fullmatch: "$" would let a trailing newline in
HISTORY_COUNTS = ("inputs", "duplicates", "changed", "unverified", "first_sample",
                  "num_samples")


def _count_ok(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_JSON_INT


def _entry_problem(entry, names: set) -> str | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("at"), str):
        return "is not an object with a time 'at'"
    for key in HISTORY_COUNTS:
        if not _count_ok(entry.get(key)):
            return f"{key} is {entry.get(key)!r:.40}, expected a count"
    for key in ("replaced", "retried"):
        if key in entry and not _count_ok(entry[key]):
            return f"{key} is {entry[key]!r:.40}, expected a count"
    for key in ("shards", "new_classes"):
        if not isinstance(entry.get(key), list) or \
                not all(isinstance(x, str) for x in entry[key]):
            return f"{key} is not a list of names"
    missing = [s for s in entry["shards"] if s not in names]
    if missing:
        return f"lists shard {missing[0]!r:.60}, which the manifest does not"
    return None


def check_history(manifest: dict, where: str) -> None:
    """FormatError naming ``where`` and the entry when a manifest's ``history`` (optional)
    is not a list of append entries whose shards the manifest lists."""
    history = manifest.get(HISTORY_KEY)
    if history is None:
        return
    if not isinstance(history, list):
        raise FormatError(f"{where}: history is {type(history).__name__}, expected a list of "
                          f"appends")
    names = {s["name"] for s in manifest["shards"]}
    for i, entry in enumerate(history):
        problem = _entry_problem(entry, names)
        if problem:
            raise FormatError(f"{where}: history[{i}] {problem}; the manifest was edited or "
                              f"damaged: convert the source again")


def sources_of(meta: dict, num_records: int) -> list | None:
    """The input hashes a shard's metadata records (one per record), or None when it has
    none (packed before they were recorded) or they do not fit (damaged: not trusted)."""
    sources = meta.get(SOURCES_KEY)
    if not isinstance(sources, list) or len(sources) != num_records or \
            not all(isinstance(s, str) and SHA256_RE.fullmatch(s) for s in sources):
        return None
    return sources
