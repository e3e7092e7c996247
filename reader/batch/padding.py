"""Detection-sized batches: ``Loader(..., pad=True, pad_multiple=32)``.

``Resize(800, max_size=1333)`` without a crop gives every image its own size. With ``pad``
each image is made at its own size, placed top-left in a batch as large as the batch's
largest image (each side rounded up to ``pad_multiple``), and the rest is zero *after*
normalisation, as torchvision's detection models batch images (GeneralizedRCNNTransform).
Boxes are not moved by padding; masks are padded with the ignore value (255 by default).
The true (height, width) of every image is yielded beside the batch.

Pure functions of their arguments; the host build (host.py) and the consumer (targets.py)
call them. The GPU kernels write one size per batch, so padded batches are made on the host.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

MAX_PAD_MULTIPLE = 4096  # beyond this: a typo, not a stride


def check_pad(pad, pad_multiple, mask_pad_value) -> int:
    """The pad setting as one int: 0 (off), else the multiple each side is rounded up to
    (1: exactly the largest image). ValueError naming the bad value otherwise."""
    if not isinstance(pad, bool):
        raise TypeError(f"pad={pad!r}: expected True or False")
    multiple = int(pad_multiple)
    if not 1 <= multiple <= MAX_PAD_MULTIPLE:
        raise ValueError(f"pad_multiple={pad_multiple!r}: expected 1 to {MAX_PAD_MULTIPLE} "
                         f"(e.g. 32, the stride of a detection backbone)")
    if not isinstance(mask_pad_value, int) or not 0 <= mask_pad_value < 2**16:
        raise ValueError(f"mask_pad_value={mask_pad_value!r}: expected an int 0..65535 "
                         f"(255: the usual ignore index)")
    return multiple if pad else 0


def round_up(value, multiple: int):
    """``value`` rounded up to a multiple of ``multiple`` (ints or int arrays)."""
    return -(-value // multiple) * multiple


def sample_sizes(geometry, hs, ws) -> np.ndarray:
    """(N, 2) int64 output (height, width) of every sample under ``geometry`` (its own
    size for a Resize(int) without a crop; the stored size without geometry)."""
    hs, ws = np.asarray(hs, np.int64), np.asarray(ws, np.int64)
    if geometry is None:
        return np.stack([hs, ws], axis=1)
    resize = getattr(geometry, "resize", None)
    if getattr(geometry, "crop", True) is None and not isinstance(resize.size, tuple):
        return np.stack(resize.resized_shape(hs, ws), axis=1)
    h, w = geometry.size
    return np.stack([np.full_like(hs, h), np.full_like(ws, w)], axis=1)


def pad_params(params, sizes: np.ndarray, multiple: int):
    """``params`` with per-sample ``sizes`` and the padded batch ``out_size``."""
    if not len(sizes):
        return replace(params, sizes=sizes)
    out = round_up(sizes.max(axis=0), multiple)
    return replace(params, sizes=sizes, out_size=(int(out[0]), int(out[1])))


def largest_output(geometry, dataset, multiple: int) -> tuple[int, int]:
    """(height, width) bounding every padded batch of ``dataset`` (sizes shared buffers)."""
    hs = np.concatenate([s.index["height"] for s in dataset.shards] or [np.ones(1)])
    ws = np.concatenate([s.index["width"] for s in dataset.shards] or [np.ones(1)])
    sizes = sample_sizes(geometry, hs, ws)
    out = round_up(sizes.max(axis=0, initial=1), max(1, multiple))
    return int(out[0]), int(out[1])


def place(sample: np.ndarray, out: np.ndarray, pos: int) -> None:
    """Copy a (C, h, w) sample into row ``pos`` of the (N, C, OH, OW) ``out``, top-left,
    and zero the rest of that row (the buffers are recycled)."""
    _, h, w = sample.shape
    row = out[pos]
    row[:, :h, :w] = sample
    row[:, h:, :] = 0
    row[:, :h, w:] = 0


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
