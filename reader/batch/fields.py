"""What a delivered batch holds besides its images and labels: the data set's fields,
detection and segmentation targets that follow every crop, resize, flip and pad of their
images, the true sizes of a padded batch, and the indices (``Loader(fields=(...))``).

The workers build images exactly as without fields (the hot path does not change); the
fields of the samples a batch kept (``HostBatch.indices``, after skips) are read in the
consumer from the same local shards, so shuffle, ranks, resume, return_index, thread and
process workers and every transform work unchanged. Collation follows torch's
default_collate where it can: ints and floats become int64 / float64 tensors, arrays of the
schema's fixed shape one stacked tensor, arrays of varying shape a list of tensors, str /
json / bytes a list.

Targets are read the same way; their geometry is drawn again here from (seed, epoch, sample
index), the same pure function the workers used for the pixels, so no box or mask can pair
with another sample's crop. The maths is the geometry transforms' own
(reader/transforms/geometry.py). What a batch holds:

  * ``"boxes"``: a list of float32 (n_i, 4) tensors (x0, y0, x1, y1 in output pixels;
    (0, 4) when none is left);
  * a per-box field (a name in PER_BOX_FIELDS, an array with one row per box, e.g.
    ``"categories"``): a list of tensors, filtered with the boxes;
  * ``"mask"``: one (B, H, W) uint8/uint16 tensor, resampled nearest-neighbour (on the
    device path by one Triton kernel per batch, ``dlpack_io.kernels.mask_gather``), padded
    with ``mask_pad_value``;
  * with ``pad=True``, after the fields: an int64 (B, 2) tensor of the true (height, width),
    the images zero outside them (after normalisation, as torchvision pads a detection batch).
"""
from __future__ import annotations

import numpy as np

from dlpack_io.reader.dataset import check_names, read_record_fields
from dlpack_io.reader.transforms import geometry as tg

DEFAULT_FIELDS = ("image", "label")
# SDXL's micro-conditioning under AspectBuckets: each sample's stored (upright) size, the
# top-left corner of its crop in the resized image, and its bucket, int64 (B, 2) each
CONDITIONING = ("original_size", "crop_top_left", "target_size")


def check_fields(dataset, names, buckets=None) -> tuple:
    """The Loader's ``fields`` option as a tuple of names the data set has: "image",
    "label" and the manifest's fields, each once (with AspectBuckets also CONDITIONING,
    unless the data set has fields of those names); ValueError naming the data set."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names) or not names:
        raise ValueError(f"fields {names!r}: expected a non-empty tuple of field names, "
                         f"e.g. ('image', 'label')")
    names = tuple(names)
    if len(set(names)) != len(names):
        raise ValueError(f"fields {names!r}: a field is named twice")
    made = CONDITIONING if hasattr(buckets, "crops") else ()
    try:
        check_names(dataset, [n for n in names if n not in DEFAULT_FIELDS and
                              (n not in made or n in dataset.fields)])
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


BOXES, MASK = "boxes", "mask"
#: Fields with one row per box, removed together with the boxes they belong to (COCO's
#: annotation columns and torchvision's target keys). Other fields are left as they are.
PER_BOX_FIELDS = ("categories", "labels", "iscrowd", "area", "scores", "track_ids",
                  "annotation_ids")
MASK_DTYPES = ("uint8", "uint16")


def _refuse(spec, sample_transform, names) -> None:
    what = (f"{spec.sample_ops[0].__class__.__name__} (a per-sample host op: its rotations "
            f"and shears do not move boxes or masks yet)" if spec.sample_ops else
            "MixUp / CutMix (they blend images, not their boxes or masks)" if spec.mixes else
            "sample_transform (its geometry is unknown)" if sample_transform is not None else "")
    if what:
        raise ValueError(f"fields {names}: boxes and masks follow the crop, resize, flip and "
                         f"pad transforms, but not {what}; leave it out for this Loader")


def is_label_map(spec) -> bool:
    """True when a ``"mask"`` field's spec is a label map that follows the image (a 2-D
    uint8 / uint16 array); any other ``"mask"`` is an ordinary field, passed through."""
    return spec.get("type") == "array" and spec.get("ndim") == 2 and \
        spec.get("dtype") in MASK_DTYPES


def check_targets(dataset, names, spec, sample_transform=None) -> None:
    """ValueError unless ``names``' targets can follow ``spec`` (schema and transforms)."""
    schema = dataset.fields
    targets = [n for n in names if n in schema and (n == BOXES or n in PER_BOX_FIELDS or
                                                    n == MASK and is_label_map(schema[n]))]
    if not targets:
        return
    _refuse(spec, sample_transform, tuple(names))
    for name in targets:
        s = schema[name]
        ndim = s.get("ndim")
        ok = name == MASK or s["type"] == "array" and (
            ndim == 2 and (s.get("shape") is None or s["shape"][1] == 4) if name == BOXES else
            isinstance(ndim, int) and ndim >= 1)
        if not ok:
            want = "a float array of shape [N, 4] (x0, y0, x1, y1)" if name == BOXES else \
                "an array with one row per box"
            raise ValueError(f"{dataset.path}: field {name!r} is {s}; as a detection target "
                             f"it must be {want}")


class Assembler:
    """The tuple a Loader yields for its ``fields`` (with targets, padding, indices):
    built once from the checked ``names``, the spec and the LoaderOptions ``opts``."""

    def __init__(self, dataset, names, spec, opts, on_device: bool, public_indices):
        check_targets(dataset, names, spec, opts.sample_transform)
        self.dataset, self.names, self.spec = dataset, tuple(names), spec
        self.seed, self.on_device, self.fill = int(opts.seed), bool(on_device), \
            int(opts.output.mask_pad_value)
        self.return_index = bool(opts.output.return_index)
        self.public_indices = public_indices  # what return_index shows (sources.py)
        schema = dataset.fields
        self.per_box = tuple(n for n in self.names if n in PER_BOX_FIELDS and n in schema
                             and BOXES in schema)
        self.mask = MASK in self.names and MASK in schema and is_label_map(schema[MASK])
        if self.mask and self.fill > np.iinfo(schema[MASK]["dtype"]).max:
            raise ValueError(f"mask_pad_value={self.fill}: the masks of {dataset.path} are "
                             f"{schema[MASK]['dtype']} (0..{np.iinfo(schema[MASK]['dtype']).max}"
                             f"); give a value they can hold (255: the usual ignore index)")
        self.boxes = BOXES in self.names and BOXES in schema
        self.geometric = self.boxes or self.mask or bool(self.per_box) or bool(spec.pad)
        self.made = tuple(n for n in self.names if n in CONDITIONING and n not in schema)
        extra = [n for n in self.names if n not in DEFAULT_FIELDS and n not in self.made]
        self.read = tuple(extra) + ((BOXES,) if self.per_box and not self.boxes else ())
        self.plain = self.names == DEFAULT_FIELDS and not spec.pad

    def __call__(self, images, labels, indices, epoch: int) -> tuple:
        """(fields in order[, true sizes][, indices]) of one delivered batch."""
        out = (images, labels) if self.plain else self._fields(images, labels, indices, epoch)
        return (*out, self.public_indices(self.dataset, indices)) if self.return_index else out

    def _fields(self, images, labels, indices, epoch: int) -> tuple:
        import torch

        device, indices = labels.device, np.asarray(indices, np.int64)
        shard_ids, local, entries = self.dataset.lookup(indices)
        rows = [read_record_fields(self.dataset, int(i), int(k), int(j), self.read)
                if self.read else {}
                for i, k, j in zip(indices.tolist(), shard_ids.tolist(), local.tolist())]
        out = {n: collate([r[n] for r in rows], self.dataset.fields[n], device)
               for n in self.read if n not in (BOXES,) + (MASK,) * self.mask + self.per_box}
        sizes = None
        if self.geometric:
            params = self.spec.draw(self.seed, epoch, indices, entries["height"],
                                    entries["width"])
            src, sizes = tg.sample_geometry(params, self.on_device)
            geo = (src, sizes, params.flip_h, params.flip_v)
            if self.boxes or self.per_box:
                out.update(self._boxes(rows, geo, indices, device))
            if self.mask:
                out[MASK] = self._masks(rows, geo, entries, indices, tuple(images.shape[-2:]),
                                        device)
        if self.made:
            out.update(self._conditioning(entries, indices, epoch, device))
        if self.spec.pad:
            images = zero_padding(images, sizes)
        result = tuple(images if n == "image" else labels if n == "label" else out[n]
                       for n in self.names)
        if self.spec.pad:
            result += (torch.from_numpy(np.ascontiguousarray(sizes)).to(device),)
        return result

    def _conditioning(self, entries, indices, epoch: int, device) -> dict:
        """SDXL's micro-conditioning of the batch's samples, drawn again from (seed, epoch,
        index) as the workers drew their crops."""
        import torch

        from dlpack_io.reader.batch.plan import Draws

        hs, ws = entries["height"].astype(np.int64), entries["width"].astype(np.int64)
        _, corner, bucket = self.spec.geometry.crops(hs, ws, Draws(self.seed, epoch), indices)
        values = {"original_size": np.stack([hs, ws], axis=1), "crop_top_left": corner,
                  "target_size": np.tile(np.asarray(bucket, np.int64), (len(hs), 1))}
        return {n: torch.from_numpy(np.ascontiguousarray(values[n])).to(device)
                for n in self.made}

    def _where(self, index: int) -> str:
        return self.dataset.where(int(index))

    def _box_rows(self, value, index: int) -> np.ndarray:
        b = np.asarray(value)
        if b.size == 0:
            return np.zeros((0, 4), np.float64)
        if b.ndim != 2 or b.shape[1] != 4 or not np.all(np.isfinite(b)):
            raise ValueError(f"{self._where(index)}: boxes of shape {b.shape}: expected finite "
                             f"[N, 4] (x0, y0, x1, y1); repack the sample")
        return b

    def _boxes(self, rows, geo, indices, device) -> dict:
        """name -> list of per-sample tensors for "boxes" and the per-box fields."""
        if not rows:
            return {n: [] for n in self.per_box + (BOXES,) * self.boxes}
        src, sizes, fh, fv = geo
        boxes = [self._box_rows(row[BOXES], indices[i]) for i, row in enumerate(rows)]
        counts = np.array([len(b) for b in boxes], dtype=np.int64)
        owner = np.repeat(np.arange(len(boxes)), counts)
        mapped = tg.map_boxes(np.concatenate(boxes) if boxes else np.zeros((0, 4)), owner,
                              src, sizes, fh, fv)
        keep = tg.kept(mapped)
        kept_counts = np.bincount(owner[keep], minlength=len(boxes)).tolist()
        out = {n: _split(np.concatenate(self._column(rows, n, counts, indices))[keep],
                         kept_counts, device) for n in self.per_box}
        if self.boxes:
            out[BOXES] = _split(mapped[keep].astype(np.float32), kept_counts, device)
        return out

    def _column(self, rows, name: str, counts, indices) -> list:
        """The per-box field ``name`` of every sample, checked to hold one row per box."""
        values = [np.asarray(row[name]) for row in rows]
        for i, v in enumerate(values):
            if v.shape[:1] != (int(counts[i]),):
                raise ValueError(f"{self._where(indices[i])}: field {name!r} has "
                                 f"{v.shape[:1] or 'no'} rows for {int(counts[i])} boxes; a "
                                 f"per-box field needs one row per box")
        return values

    def _masks(self, rows, geo, entries, indices, out_size, device):
        """The (B, OH, OW) mask batch on ``device``."""
        import torch

        src, sizes, fh, fv = geo
        hs, ws = entries["height"].astype(np.int64), entries["width"].astype(np.int64)
        masks = [np.asarray(r[MASK]) for r in rows]
        for i, m in enumerate(masks):
            if m.shape != (hs[i], ws[i]):
                raise ValueError(f"{self._where(indices[i])}: mask {m.shape[0]}x{m.shape[1]} "
                                 f"but image {hs[i]}x{ws[i]}: a mask must be the image's size")
        r, c = tg.mask_tables(src, sizes, fh, fv, hs, ws, out_size)
        dtype = np.dtype(self.dataset.fields[MASK]["dtype"])
        if not self.on_device or not masks:
            return torch.from_numpy(tg.gather_masks(masks, r, c, self.fill, dtype)).to(device)
        from dlpack_io import kernels

        flat = np.concatenate([m.reshape(-1) for m in masks]).astype(dtype, copy=False)
        sizes_hw = np.stack([hs, ws], axis=1)
        offsets = np.concatenate([[0], np.cumsum(hs * ws)[:-1]]).astype(np.int64)
        move = (lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device))
        # the tables are ours and clamped, the shapes checked above: no device sync
        return kernels.mask_gather(move(flat), move(offsets), move(sizes_hw), move(r), move(c),
                                   self.fill, validate=False)


def _split(whole: np.ndarray, counts: list, device) -> list:
    """Rows of ``whole`` as a list of per-sample tensors on ``device`` (one copy)."""
    import torch

    if not counts:
        return []
    return list(torch.split(torch.from_numpy(np.ascontiguousarray(whole)).to(device), counts))


def valid_area(sizes, out_size, device):
    """(N, 1, OH, OW) bool tensor: True inside each sample's true size."""
    import torch

    sizes = torch.as_tensor(np.asarray(sizes, np.int64).reshape(-1, 2), device=device)
    rows = torch.arange(out_size[0], device=device)[None, :, None] < sizes[:, 0, None, None]
    cols = torch.arange(out_size[1], device=device)[None, None, :] < sizes[:, 1, None, None]
    return (rows & cols)[:, None]


def zero_padding(images, sizes):
    """``images`` (N, C, OH, OW) with everything outside each sample's size set to 0
    (after normalisation, as torchvision pads a detection batch)."""
    if not len(sizes):
        return images
    keep = valid_area(sizes, tuple(images.shape[-2:]), images.device)
    return images.masked_fill_(~keep, 0)
