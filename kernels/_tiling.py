"""How the kernels split a batch into programs, shared by every op.

One program writes one BLOCK_H x BLOCK_W tile of output pixels of one sample, for all of
its channels: a [BLOCK_H * BLOCK_W, CP] tile (CP = channels rounded up to a power of two,
the padding lanes masked). Each channel plane of the NCHW output is then written as
BLOCK_W-long contiguous runs. The grid is one flat axis of N * tiles_per_sample programs
(no 65535 limit on the batch); sizes are runtime ints so a new batch or image size never
recompiles, only the channel count, flags and dtypes are compile-time constants.
"""

from __future__ import annotations

import contextlib

import torch

from dlpack_io.kernels._triton import lazy_jit

tl = None  # bound to triton.language by lazy_jit on first launch

BLOCK_H = 16  # output rows per program
BLOCK_W = 32  # output columns per program (224 = 7 * 32: no masked lanes at ImageNet size)
NUM_WARPS = 4
MAX_PROGRAMS = 2**31 - 1  # CUDA grid x-dimension limit


def channel_pad(channels: int) -> int:
    """Channels rounded up to a power of two (1, 2, 4)."""
    return 1 if channels == 1 else 2 if channels == 2 else 4


def tile_grid(op: str, n: int, out_h: int, out_w: int) -> tuple[tuple[int], int, int]:
    """Return ``(grid, tiles_x, tiles_per_sample)`` for an (N, out_h, out_w) output."""
    tiles_x = -(-out_w // BLOCK_W)
    tiles = -(-out_h // BLOCK_H) * tiles_x
    if n * tiles > MAX_PROGRAMS:
        raise ValueError(f"{op}: batch of {n} images of {out_h}x{out_w} needs {n * tiles} "
                         f"programs, more than the {MAX_PROGRAMS} one launch allows; split it")
    return (n * tiles,), tiles_x, tiles


def device_guard(device: torch.device):
    """Make ``device`` current for the launch (Triton launches on the current device)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


@lazy_jit
def tile_coords(OH, OW, tiles_x, tiles_per_sample,
                BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """Sample index, output row/column vectors and in-bounds mask of this program."""
    pid = tl.program_id(0)
    n = pid // tiles_per_sample
    t = pid - n * tiles_per_sample
    ty = t // tiles_x
    tx = t - ty * tiles_x
    i = tl.arange(0, BLOCK_H * BLOCK_W)
    oy = ty * BLOCK_H + i // BLOCK_W
    ox = tx * BLOCK_W + i % BLOCK_W
    return n, oy, ox, (oy < OH) & (ox < OW)


@lazy_jit
def store_planes(out_ptr, val, n, oy, ox, pmask, cols, OH, OW, C: tl.constexpr):
    """Store a [pixels, CP] tile to the NCHW output of sample ``n`` (int64 batch offset)."""
    plane = OH * OW
    dst = out_ptr + n.to(tl.int64) * (C * plane)
    offs = cols[None, :] * plane + (oy * OW + ox)[:, None]
    mask = pmask[:, None] & (cols < C)[None, :]
    tl.store(dst + offs, val.to(out_ptr.dtype.element_ty), mask=mask)
