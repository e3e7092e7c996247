"""The shape every record of an array field shares, found while packing, so that the
manifest states it and the Loader stacks the field into one tensor.

``dlpack convert`` packs in one streaming pass, so a sidecar's shape (``.npy``, ``.cls``)
is not known before the last record: each record's field block is read back for its array
shapes as it is added (``block_shapes``), the open shard's shapes are kept with its other
counts and journaled with it (a resumed run merges the kept shards' shapes), and the
manifest's schema gets ``"shape"`` only when every packed record agrees (``settle``).
A journal line without shapes (written by an older dlpack) or with malformed ones leaves
the shapes unknown: null, as before, never a shape some record does not have.
"""
from __future__ import annotations

import struct

from dlpack_io.reader.format.fields import field_spans

_MAX_DIM = 2**32  # a dimension is stored as u4


def array_names(schema, skip=()) -> tuple:
    """The names of ``schema``'s array fields, sorted (empty for no schema), less those of
    ``skip``: detection targets (boxes, categories, masks), per-sample arrays never stacked
    (packer/targets.py)."""
    return tuple(sorted(n for n, s in (schema or {}).items()
                        if s["type"] == "array" and n not in skip))


def block_shapes(block, schema: dict, names: tuple) -> dict:
    """name -> shape (list) of the array fields ``names`` in a record's field ``block``."""
    spans = field_spans(block, schema, "field block")
    return {n: list(struct.unpack_from(f"<{schema[n]['ndim']}I", block, spans[n][0]))
            for n in names}


def merge(acc: dict | None, shapes: dict | None) -> dict | None:
    """``acc`` with ``shapes`` merged in: a name whose shapes differ maps to None; None
    (unknown) absorbs everything."""
    if acc is None or shapes is None:
        return None
    for name, shape in shapes.items():
        if name not in acc:
            acc[name] = shape
        elif acc[name] != shape:
            acc[name] = None
    return acc


def journaled(value) -> dict | None:
    """The shapes of a journal line (untrusted: written to disk by an earlier run); None
    when absent or malformed (then nothing is claimed)."""
    if not isinstance(value, dict):
        return None
    for name, shape in value.items():
        if not isinstance(name, str) or not (shape is None or (
                isinstance(shape, list) and len(shape) <= 32 and all(
                    isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _MAX_DIM
                    for d in shape))):
            return None
    return dict(value)


def settle(schema, shapes: dict | None):
    """A copy of ``schema`` whose array fields have ``"shape"``: the one every record has
    (from ``shapes``), else null; None stays None."""
    if not schema:
        return schema
    out = {}
    for name, spec in schema.items():
        spec = dict(spec)
        if spec["type"] == "array":
            shape = None if shapes is None else shapes.get(name)
            known = spec.get("shape")  # a list's arrays are checked before packing
            spec["shape"] = shape if shape is not None and len(shape) == spec["ndim"] \
                and known in (None, shape) else None
        out[name] = spec
    return out


def without_shapes(fields) -> dict | None:
    """``fields`` with the arrays' ``shape`` left out: what must agree for an append (the
    shape is a finding about the records, not a choice)."""
    return {n: {k: v for k, v in s.items() if k != "shape"} for n, s in fields.items()} \
        if fields else None


def union(base, new):
    """The schema of a data set after an append: ``new``'s (same fields as ``base``'s),
    an array keeping a shape only where the old and the new records state the same one."""
    if not new or not base:
        return new
    out = {}
    for name, spec in new.items():
        spec = dict(spec)
        if spec["type"] == "array" and spec.get("shape") != base.get(name, {}).get("shape"):
            spec["shape"] = None
        out[name] = spec
    return out
