"""``Loader(ds, fields=(...))``: a batch's fields beside its images and labels.

The workers build images exactly as without fields (the hot path does not change); the
fields of the samples a batch kept (``HostBatch.indices``, after skips) are read in the
consumer from the same local shards, so shuffle, ranks, resume, return_index, thread and
process workers and every transform work unchanged. Collation follows torch's
default_collate where it can: ints and floats become int64 / float64 tensors, arrays of
the schema's fixed shape one stacked tensor, arrays of varying shape a list of tensors,
str / json / bytes a list. The batch's tuple itself (fields in order, detection targets
that follow the geometry, padding, indices) is built by targets.Assembler.
"""
from __future__ import annotations

import numpy as np

from dlpack_io.reader.samplefields import check_names

DEFAULT_FIELDS = ("image", "label")


def check_fields(dataset, names) -> tuple:
    """The Loader's ``fields`` option as a tuple of names the data set has: "image",
    "label" and the manifest's fields, each once; ValueError naming the data set."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names) or not names:
        raise ValueError(f"fields {names!r}: expected a non-empty tuple of field names, "
                         f"e.g. ('image', 'label')")
    names = tuple(names)
    if len(set(names)) != len(names):
        raise ValueError(f"fields {names!r}: a field is named twice")
    try:
        check_names(dataset, [n for n in names if n not in DEFAULT_FIELDS])
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    return names


def collate(values: list, spec: dict, device):
    """One field of a batch, collated as default_collate would (see the module doc)."""
    import torch

    kind = spec["type"]
    if kind in ("int", "float"):
        out = torch.tensor(values, dtype=torch.int64 if kind == "int" else torch.float64)
    elif kind == "array" and spec.get("shape") is not None:
        shape = [len(values)] + spec["shape"]
        out = torch.from_numpy(np.stack(values) if values else np.zeros(shape, spec["dtype"]))
    elif kind == "array":
        return [torch.from_numpy(v).to(device, non_blocking=True) for v in values]
    else:
        return values
    return out.to(device, non_blocking=True)
