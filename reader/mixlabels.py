"""A Mixture's labels: each set's own (the default), or remapped onto one class list.

``classes=None`` keeps every set's labels as it stored them: label 3 of set 0 and label 3
of set 1 are both 3, whatever their names (right for sets packed with the same class list,
or when the training loop tells sets apart itself). ``classes="union"`` builds one list:
the first set's classes in their order, then each later set's new names in its order, so
set 0's labels never change; the other sets' labels are remapped by name. ``classes=[...]``
is an explicit list that must name every class of every set. Unlabelled samples (-1) stay
-1 in every mode.
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("dlpack_io.reader.mixture")


def _keep(datasets) -> list[str]:
    """The class list of ``classes=None``: the longest set's, when every other set's list is
    a prefix of it; otherwise one name per label number, the sets' names joined by '|'."""
    lists = [list(ds.classes) for ds in datasets]
    longest = max(lists, key=len)
    if all(c == longest[:len(c)] for c in lists):
        return longest
    log.warning("Mixture: the sets name their labels differently (%s); labels are kept as "
                "each set stored them. Pass classes='union' to remap them by name",
                "; ".join(f"set {s}: {c[:3]}{'...' if len(c) > 3 else ''}"
                          for s, c in enumerate(lists)))
    return ["|".join(dict.fromkeys(c[k] for c in lists if k < len(c)))
            for k in range(len(longest))]


def _union(datasets) -> list[str]:
    names: dict[str, None] = {}
    for ds in datasets:
        names.update(dict.fromkeys(ds.classes))
    return list(names)


def resolve_classes(datasets, classes) -> tuple[list[str], list]:
    """(the mixture's class names, per set a label lookup table or None for unchanged)."""
    if classes is None:
        return _keep(datasets), [None] * len(datasets)
    if isinstance(classes, str):
        if classes != "union":
            raise ValueError(f"Mixture classes={classes!r}: expected None (keep each set's "
                             f"labels), 'union' or a list of class names")
        names = _union(datasets)
    else:
        names = list(classes)
        if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            raise ValueError(f"Mixture classes={classes!r}: expected distinct class names")
    where = {n: k for k, n in enumerate(names)}
    tables = []
    for s, ds in enumerate(datasets):
        missing = [n for n in ds.classes if n not in where]
        if missing:
            raise ValueError(f"Mixture set {s} ({ds.path}): class {missing[0]!r} is not in "
                             f"classes= ({len(names)} names); add it, or pass "
                             f"classes='union'")
        table = np.array([where[n] for n in ds.classes], dtype=np.int64)
        tables.append(None if np.array_equal(table, np.arange(len(table))) else table)
    return names, tables


def remap(labels: np.ndarray, table, where: str) -> np.ndarray:
    """``labels`` (one set's, as stored) through ``table``; -1 (no label) stays -1.
    ValueError naming ``where`` (the set) for a label past the set's class list."""
    if table is None or not len(labels):
        return labels
    labelled = labels >= 0
    if labelled.any() and int(labels[labelled].max()) >= len(table):
        raise ValueError(f"{where}: label {int(labels[labelled].max())} but the set names "
                         f"only {len(table)} classes: its manifest and shards disagree")
    out = labels.copy()
    out[labelled] = table[labels[labelled].astype(np.int64)]
    return out
