"""What every launcher needs besides its kernel: lazy Triton, the backend choice, tiling.

Triton is optional at run time, so no module of ours imports it at import time. Kernel
modules write their kernels at module level as usual, but decorate them with
:func:`lazy_jit` instead of ``@triton.jit`` and declare ``tl = None``; with
``from __future__ import annotations`` the ``tl.constexpr`` annotations stay strings
(Triton reads them as strings). The first launch imports triton, binds ``tl`` in the
kernel module and in every module whose lazy kernels it uses, and replaces each lazy
kernel by the real ``triton.jit`` object.

:func:`use_triton` is the one place that decides between the Triton kernel and the torch
reference: CUDA tensors use Triton (when it is installed), CPU tensors use Triton's
interpreter only when ``TRITON_INTERPRET=1`` is set, everything else the torch reference.

Tiling, shared by every op: one program writes one BLOCK_H x BLOCK_W tile of output pixels
of one sample, for all of its channels, held as one ``[BLOCK_H, BLOCK_W]`` float32 tile per
channel. Row quantities (source rows, vertical weights) are ``[BLOCK_H, 1]`` and column
quantities ``[1, BLOCK_W]``, so index maths and filter weights are computed once per row /
column, not per pixel, and every tile shares one register layout (no layout conversion in
the tap loops; tests/kernels/test_kernels_compile.py checks the sm_90 TTGIR). Each channel
plane of the NCHW output is written as BLOCK_W-long contiguous runs. The grid is one flat
axis of N * tiles_per_sample programs (no 65535 limit on the batch).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
from typing import Any, Callable, Optional

import torch

log = logging.getLogger(__name__)

tl = None  # bound to triton.language by lazy_jit on first launch

BLOCK_H = 32  # output rows per program
BLOCK_W = 32  # output columns per program (224 = 7 * 32: no masked lanes at ImageNet size)
NUM_WARPS = 4
MAX_PROGRAMS = 2**31 - 1  # CUDA grid x-dimension limit

#: Launch options shared by every kernel. FP contraction is off so the kernels round like
#: the torch reference (these kernels are memory bound; FMA buys nothing).
LAUNCH_OPTIONS: dict[str, Any] = {"enable_fp_fusion": False}

# "interpret" or "compiled": fixed by the first launch in this process (triton.jit picks
# the interpreter from TRITON_INTERPRET at that moment and kernels are jitted only once).
_mode: list[str] = []


class LazyJit:
    """A ``@triton.jit`` stand-in that imports triton and jits on first use."""

    def __init__(self, fn: Callable, jit_options: Optional[dict] = None) -> None:
        self.fn = fn
        self.jit_options = dict(jit_options or {})
        self._jitted: Any = None
        functools.update_wrapper(self, fn)

    def jitted(self) -> Any:
        """Return the real Triton kernel, binding every lazy kernel it can call."""
        if self._jitted is None:
            _bind_module(self.fn.__globals__, set())
        return self._jitted

    def __getitem__(self, grid: Any) -> Any:
        return self.jitted()[grid]


def lazy_jit(fn: Optional[Callable] = None, **jit_options: Any):
    """Decorate a Triton kernel (or ``@triton.jit`` helper) without importing triton.

    ``@lazy_jit`` or ``@lazy_jit(do_not_specialize=("H", "W"))``: keyword options are
    passed to ``triton.jit`` on first use.
    """
    if fn is None:
        return lambda f: LazyJit(f, jit_options)
    return LazyJit(fn, jit_options)


def _bind_module(namespace: dict, seen: set[int]) -> None:
    """Bind ``tl`` and jit every :class:`LazyJit` in a module namespace (and its deps)."""
    if id(namespace) in seen:
        return
    seen.add(id(namespace))
    import triton
    import triton.language

    if not _mode:
        _mode.append("interpret" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled")

    namespace["tl"] = triton.language
    for name, value in list(namespace.items()):
        if isinstance(value, LazyJit):
            if value._jitted is None:
                value._jitted = triton.jit(value.fn, **value.jit_options)
            namespace[name] = value._jitted
            _bind_module(value.fn.__globals__, seen)


@functools.lru_cache(maxsize=None)
def triton_installed() -> bool:
    """True when the ``triton`` package can be imported (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def use_triton(device: torch.device) -> bool:
    """Decide whether tensors on ``device`` go through the Triton kernel.

    CUDA: yes when triton is installed (otherwise the torch reference runs on the GPU and
    a warning is logged once), unless this process jitted the kernels for the interpreter
    and ``TRITON_INTERPRET`` is no longer set. CPU: only under ``TRITON_INTERPRET=1``
    (Triton's interpreter, what the tests use) and only if this process has not already
    compiled the kernels for the GPU; otherwise the torch reference. Other devices: the
    torch reference.
    """
    if device.type == "cuda":
        if not triton_installed():
            _warn_once("triton is not installed: CUDA tensors use the torch reference path")
            return False
        if _mode == ["interpret"] and os.environ.get("TRITON_INTERPRET") != "1":
            _warn_once("the kernels were jitted for Triton's interpreter earlier in this "
                       "process: CUDA tensors use the torch reference path")
            return False
        return True
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        if not triton_installed():
            _warn_once("triton is not installed: TRITON_INTERPRET=1 is ignored, CPU tensors "
                       "use the torch reference path")
        elif _mode == ["compiled"]:
            _warn_once("TRITON_INTERPRET=1 was set after the kernels were compiled for the "
                       "GPU in this process: CPU tensors use the torch reference path")
        else:
            return True
    return False


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    log.warning(message)


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


def kernel_args(ep, records: torch.Tensor, means: Optional[torch.Tensor],
                stats: Optional[torch.Tensor]) -> tuple:
    """Pointer arguments ``rec, scale, bias, cmean, stats`` of an ``epilogue.Epilogue`` ``ep``
    (unused slots get ``scale``)."""
    return (records, ep.scale, ep.bias, ep.scale if means is None else means,
            ep.scale if stats is None else stats)


def contrast_means(ep, *, n: int, tiles: int, pixels: int, channels: int,
                   run_stats: Callable[[torch.Tensor], None]) -> Optional[torch.Tensor]:
    """Per-sample contrast means of an ``epilogue.Epilogue`` ``ep`` for the main pass: the
    caller's, or measured.

    ``run_stats(partials)`` launches the kernel in statistics mode: each program stores the
    sum of its tile's grayscale (as the image is when contrast comes) at its program id.
    The mean is the sum of a sample's tiles, in tile order, over its pixel count (times
    ``channels`` for non-RGB images, whose mean runs over all channels).
    """
    if ep.contrast_mean is not None or not ep.needs_stats:
        return ep.contrast_mean
    partials = torch.empty(n * tiles, dtype=torch.float32, device=ep.scale.device)
    run_stats(partials)
    count = pixels if channels == 3 else pixels * channels
    return partials.view(n, tiles).sum(1).div_(float(count))


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


@lazy_jit
def load_box(rec_ptr, n):
    """``(top, left, height, width, flip_h, flip_v)`` of sample ``n``'s record
    (``records.py``: 16 int32 words per sample; Triton cannot read our module constants)."""
    rec = rec_ptr + n * 16
    flags = tl.load(rec + 4)
    return (tl.load(rec), tl.load(rec + 1), tl.load(rec + 2), tl.load(rec + 3),
            (flags & 1) != 0, (flags & 2) != 0)


@lazy_jit
def clamp(v, lo, hi):
    """``min(max(v, lo), hi)``."""
    return tl.minimum(tl.maximum(v, lo), hi)
