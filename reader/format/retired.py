"""Records retired by ``dlpack convert --append --replace-changed``: a changed input's new
content is packed into the append's new shards and its old record is retired, without a
byte of an old shard changing.

* Manifest ``"retired"``: a list of ``[old, new]`` pairs of record numbers (the global
  record numbers of the shards' ``first_sample`` + position; the manifest's
  ``num_samples`` counts every record, retired ones included), sorted by ``old``: record
  ``old`` is retired and record ``new`` (packed later, so ``new > old``) takes its place.
  A later append may retire ``new`` in turn (a chain: the last record of it is served).
* A manifest with ``"retired"`` has version ``RETIRING_VERSION`` (4), which readers older
  than this key refuse with "upgrade dlpack" rather than silently serving the stale
  record beside its replacement. Shards keep their own versions (2 or 3); a version-4
  manifest declares its ``fields`` (maybe none), as version 3 does.

Sample order (``sample_records``): the data set's sample ``i`` is the ``i``-th record that
no pair names as ``new``, with a retired record replaced by the last record of its chain.
So every sample that existed before an append keeps its index (a replaced one now shows its
new content), new samples follow in record order, and the indices stay dense:
``len(dataset) == num_samples - len(retired)``.
"""
from __future__ import annotations

import numpy as np

from dlpack_io.reader.format.spec import FormatError

RETIRED_KEY = "retired"
RETIRING_VERSION = 4  # manifest only: version 3 + "retired"


def retired_pairs(manifest: dict) -> list:
    """The manifest's ``[old, new]`` pairs (empty when it retires nothing)."""
    return manifest.get(RETIRED_KEY) or []


def check_retired(manifest: dict, where: str) -> None:
    """FormatError naming ``where`` unless ``retired`` (present exactly when the version is
    RETIRING_VERSION) is a sorted list of at most num_samples pairs of record numbers in
    range, ``old < new``, no record retired twice and no record replacing two."""
    pairs = manifest.get(RETIRED_KEY)
    if (pairs is not None) != (manifest["version"] == RETIRING_VERSION):
        raise FormatError(f"{where}: version {manifest['version']} with"
                          f"{'' if pairs is not None else 'out'} a 'retired' list: only a "
                          f"version-{RETIRING_VERSION} manifest retires records, and it must "
                          f"list them; the manifest was edited or damaged: convert again")
    if pairs is None:
        return
    n = manifest["num_samples"]
    if not isinstance(pairs, list) or not pairs or len(pairs) > n:
        raise FormatError(f"{where}: retired must be a list of 1..{n} [old, new] pairs (one "
                          f"per record at most), found {type(pairs).__name__} of "
                          f"{len(pairs) if isinstance(pairs, list) else '?'}")
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in pair)
                and 0 <= pair[0] < pair[1] < n):
            raise FormatError(f"{where}: retired[{i}] is {pair!r:.60}, expected [old, new] "
                              f"record numbers with 0 <= old < new < {n}")
    olds, news = [p[0] for p in pairs], [p[1] for p in pairs]
    if any(a >= b for a, b in zip(olds, olds[1:])):
        raise FormatError(f"{where}: retired is not sorted by old record, or retires a "
                          f"record twice; each record is retired once")
    if len(set(news)) != len(news):
        raise FormatError(f"{where}: retired names a record as the replacement of two; each "
                          f"replacement replaces one record")


def sample_records(num_records: int, pairs: list) -> np.ndarray | None:
    """The record number of each sample (int64, ``num_records - len(pairs)`` of them) for
    a manifest's checked ``pairs``; None when there are none (sample i is record i)."""
    if not pairs:
        return None
    old = np.array([p[0] for p in pairs], dtype=np.int64)
    new = np.array([p[1] for p in pairs], dtype=np.int64)
    last = dict(zip(old.tolist(), new.tolist()))
    for o in sorted(last, reverse=True):  # new > old: a chain's tail is settled first
        last[o] = last.get(last[o], last[o])
    shown = np.ones(num_records, dtype=bool)
    shown[new] = False
    records = np.flatnonzero(shown).astype(np.int64)
    heads = old[shown[old]]  # retired records that hold a place (not themselves a new)
    records[np.searchsorted(records, heads)] = [last[int(h)] for h in heads]
    return records


def retired_records(pairs: list) -> set:
    """Record numbers no sample shows any more (every ``old``)."""
    return {p[0] for p in pairs}
