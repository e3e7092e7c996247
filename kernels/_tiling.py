"""How the kernels split a batch into programs, shared by every op.

One program writes one BLOCK_H x BLOCK_W tile of output pixels of one sample, for all of
its channels, held as one ``[BLOCK_H, BLOCK_W]`` float32 tile per channel. Row quantities
(source rows, vertical weights) are ``[BLOCK_H, 1]`` and column quantities
``[1, BLOCK_W]``, so index maths and filter weights are computed once per row / column, not
per pixel, and every tile shares one register layout (no layout conversion in the tap
loops; tests/kernels/test_kernels_compile.py checks the sm_90 TTGIR). Each channel plane of the NCHW
output is written as BLOCK_W-long contiguous runs. The grid is one flat axis of
N * tiles_per_sample programs (no 65535 limit on the batch).
"""

from __future__ import annotations

import contextlib

import torch

from dlpack_io.kernels._triton import lazy_jit

tl = None  # bound to triton.language by lazy_jit on first launch

BLOCK_H = 32  # output rows per program
BLOCK_W = 32  # output columns per program (224 = 7 * 32: no masked lanes at ImageNet size)
NUM_WARPS = 4
MAX_PROGRAMS = 2**31 - 1  # CUDA grid x-dimension limit


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
    """Sample index, output rows ``[BLOCK_H, 1]``, columns ``[1, BLOCK_W]`` and the
    ``[BLOCK_H, BLOCK_W]`` in-bounds mask of this program."""
    pid = tl.program_id(0)
    n = pid // tiles_per_sample
    t = pid - n * tiles_per_sample
    ty = t // tiles_x
    tx = t - ty * tiles_x
    oy = ty * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    ox = tx * BLOCK_W + tl.arange(0, BLOCK_W)[None, :]
    return n, oy, ox, (oy < OH) & (ox < OW)
