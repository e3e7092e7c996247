"""``mask_gather``: nearest-neighbour crop + resize + flip (+ pad) of a batch of label maps.

Label maps (segmentation masks, uint8 or uint16, one per sample, each its own H x W) lie
back to back in one flat tensor. The geometry is given as per-sample source row and column
tables: for sample ``n``, output pixel ``(y, x)`` is::

    out[n, y, x] = src[offsets[n] + rows[n, y] * W[n] + cols[n, x]]   if rows, cols >= 0
                 = fill                                                otherwise (padding)

A nearest-neighbour crop-resize is a pair of such tables (each output row and column reads
the source pixel under its centre), a flip reverses a table, padding is -1: the caller
computes them once on the host (tiny: OH + OW entries per sample), so the host path and
this kernel read exactly the same pixels. Labels are copied, never interpolated, jittered
or normalised. One launch per batch; one program writes one BLOCK_H x BLOCK_W tile.
"""

from __future__ import annotations

import torch

from dlpack_io.kernels import reference
from dlpack_io.kernels.launch import (BLOCK_H, BLOCK_W, LAUNCH_OPTIONS, NUM_WARPS, device_guard,
                                      lazy_jit, tile_coords, tile_grid, use_triton)

tl = None  # bound to triton.language by lazy_jit on first launch

MASK_DTYPES = (torch.uint8, torch.uint16)


@lazy_jit(do_not_specialize=("OH", "OW", "fill"))
def _mask_gather_kernel(src_ptr, out_ptr, off_ptr, shape_ptr, rows_ptr, cols_ptr, fill,
                        OH, OW, tiles_x, tiles_per_sample,
                        BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    n, oy, ox, pmask = tile_coords(OH, OW, tiles_x, tiles_per_sample, BLOCK_H, BLOCK_W)
    n64 = n.to(tl.int64)
    sy = tl.load(rows_ptr + n64 * OH + oy, mask=oy < OH, other=-1)  # [BLOCK_H, 1]
    sx = tl.load(cols_ptr + n64 * OW + ox, mask=ox < OW, other=-1)  # [1, BLOCK_W]
    base = tl.load(off_ptr + n64)
    width = tl.load(shape_ptr + n64 * 2 + 1)
    inside = pmask & (sy >= 0) & (sx >= 0)
    # masked lanes read nothing; the index is clamped so even they stay in bounds
    at = base + tl.maximum(sy, 0).to(tl.int64) * width + tl.maximum(sx, 0).to(tl.int64)
    value = tl.load(src_ptr + at, mask=inside, other=0)
    value = tl.where(inside, value, fill).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + n64 * OH * OW + oy * OW + ox, value, mask=pmask)


def _check(src, offsets, shapes, rows, cols, fill, validate: bool) -> None:
    if not isinstance(src, torch.Tensor) or src.dtype not in MASK_DTYPES or src.dim() != 1:
        raise TypeError(f"mask_gather: src must be a 1-D uint8 or uint16 tensor (the masks "
                        f"back to back), got {getattr(src, 'dtype', type(src))} "
                        f"{tuple(getattr(src, 'shape', ()))}")
    n = offsets.shape[0] if isinstance(offsets, torch.Tensor) else -1
    want = {"offsets": ((n,), torch.int64, offsets), "shapes": ((n, 2), torch.int64, shapes),
            "rows": ((n, -1), torch.int32, rows), "cols": ((n, -1), torch.int32, cols)}
    for name, (shape, dtype, t) in want.items():
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.dim() != len(shape) or \
                t.shape[0] != n or (len(shape) == 2 and shape[1] > 0 and t.shape[1] != shape[1]) \
                or t.device != src.device or not t.is_contiguous():
            raise ValueError(f"mask_gather: {name} must be a contiguous {dtype} tensor of "
                             f"shape {shape} (-1: any) on {src.device}, got "
                             f"{getattr(t, 'dtype', type(t))} {tuple(getattr(t, 'shape', ()))}")
    if not 0 <= int(fill) <= torch.iinfo(src.dtype).max:
        raise ValueError(f"mask_gather: fill {fill} does not fit {src.dtype}")
    if validate and n:
        _check_bounds(src, offsets, shapes, rows, cols)


def _check_bounds(src, offsets, shapes, rows, cols) -> None:
    """Every table entry inside its mask, every mask inside ``src`` (one sync on CUDA)."""
    h, w = shapes[:, 0], shapes[:, 1]
    bad = (offsets < 0) | (h < 0) | (w < 0) | (offsets + h * w > src.numel())
    bad |= ((rows < -1) | (rows >= h[:, None].to(torch.int32))).any(1)
    bad |= ((cols < -1) | (cols >= w[:, None].to(torch.int32))).any(1)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"mask_gather: sample {i}: mask {int(h[i])}x{int(w[i])} at offset "
                         f"{int(offsets[i])} of {src.numel()} elements, or a row/column "
                         f"outside it; expected tables in -1..H-1 / -1..W-1")


def mask_gather(src: torch.Tensor, offsets: torch.Tensor, shapes: torch.Tensor,
                rows: torch.Tensor, cols: torch.Tensor, fill: int = 255, *,
                validate: bool = True) -> torch.Tensor:
    """Nearest-neighbour crop / resize / flip / pad a batch of label maps in one launch.

    Args:
        src: 1-D uint8 or uint16 tensor, the N masks back to back (C order each).
        offsets: (N,) int64, element offset of each mask in ``src``.
        shapes: (N, 2) int64, (H, W) of each mask.
        rows, cols: (N, OH) and (N, OW) int32 source row / column of every output row /
            column, -1 for padding.
        fill: the value of padded pixels (an ignore index, 255 by default).
        validate: check every table entry against its mask (one sync on CUDA).

    Returns:
        (N, OH, OW) tensor of ``src``'s dtype on its device.

    Raises:
        TypeError, ValueError: naming the bad argument, before anything is launched.
    """
    _check(src, offsets, shapes, rows, cols, fill, validate)
    if not use_triton(src.device):
        return reference.mask_gather(src, offsets, shapes, rows, cols, fill)
    n, oh, ow = rows.shape[0], rows.shape[1], cols.shape[1]
    out = torch.empty((n, oh, ow), dtype=src.dtype, device=src.device)
    if n == 0 or oh == 0 or ow == 0:
        return out
    grid, tiles_x, tiles = tile_grid("mask_gather", n, oh, ow)
    with device_guard(src.device):
        _mask_gather_kernel[grid](src, out, offsets, shapes, rows, cols, int(fill), oh, ow,
                                  tiles_x, tiles, BLOCK_H=BLOCK_H, BLOCK_W=BLOCK_W,
                                  num_warps=NUM_WARPS, **LAUNCH_OPTIONS)
    return out
