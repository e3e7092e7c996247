"""Geometry transforms: where each sample's pixels come from, and where its boxes and masks go.

torchvision's RandomResizedCrop, RandomCrop, CenterCrop, Resize (plus the fused
Resize-then-crop) and the two random flips. Each op is a small frozen description with
torchvision's parameters, and the maths of its own step:

* its random parameters, from the uniforms the plan stage draws for it (``draws(stream,
  indices, count)``: a pure function of (seed, epoch, sample index) that
  reader/batch/plan.py owns; ``stream`` is the op's own, fixed forever, so a sample keeps its
  crop whatever else the recipe holds) -> (top, left, height, width) boxes in the stored
  image;
* the boxes-and-masks rule (the second half of this module): the same crop, resize, flips
  and padding applied to a sample's boxes and segmentation mask, as torchvision's
  transforms.v2 moves them.

The pixels themselves are made in one pass by the build stage (C / PIL on the host) or by one
Triton kernel on the device, from the boxes and flips drawn here.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

_ATTEMPTS = 10
MIN_BOX_SIZE = 1.0  # SanitizeBoundingBoxes' default min_size: smaller boxes are removed


class TransformError(ValueError):
    """A transform cannot apply to sample ``sample`` (e.g. the image is too small)."""

    def __init__(self, message: str, sample: int):
        super().__init__(message)
        self.sample = sample


def _pair(size, name: str) -> tuple[int, int]:
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(f"{name}: size {size!r} must be an int or a (height, width) pair")
        h, w = int(size[0]), int(size[1])
    else:
        h = w = int(size)
    if h < 1 or w < 1:
        raise ValueError(f"{name}: size {size!r} must be >= 1 pixel")
    return h, w


INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


def check_interpolation(name: str, interpolation, antialias) -> tuple[str, bool]:
    """torchvision's ``interpolation`` (a name or an ``InterpolationMode``, whose ``.value``
    is the name) and ``antialias``, checked: (lower-case name, bool)."""
    mode = str(getattr(interpolation, "value", interpolation)).lower()
    if mode not in INTERPOLATIONS:
        raise ValueError(f"{name}: interpolation {interpolation!r} is not supported; expected "
                         f"one of {INTERPOLATIONS} (or torchvision's InterpolationMode of one)")
    if antialias is None:  # torchvision's old default resolves to True for PIL images
        antialias = True
    if not isinstance(antialias, bool):
        raise TypeError(f"{name}: antialias={antialias!r}: expected True or False")
    return mode, antialias


def _set_filter(obj, name: str) -> None:
    mode, aa = check_interpolation(name, obj.interpolation, obj.antialias)
    object.__setattr__(obj, "interpolation", mode)
    object.__setattr__(obj, "antialias", aa)


def _check_fits(name, size, heights, widths, indices) -> None:
    bad = np.flatnonzero((heights < size[0]) | (widths < size[1]))
    if bad.size:
        i = int(bad[0])
        raise TransformError(f"{name}{size}: the image is only {int(heights[i])}x"
                             f"{int(widths[i])} pixels; crops do not pad: put Resize before "
                             f"it, use RandomResizedCrop or a smaller size", int(indices[i]))


def _as_int64(heights, widths) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(heights, np.int64), np.asarray(widths, np.int64)


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop: a random box (area fraction in ``scale``, log-uniform
    aspect ratio in ``ratio``, 10 tries, then the central fallback) resized to ``size``
    with ``interpolation`` ("bilinear", "bicubic", "nearest"); ``antialias`` as
    torchvision's tensor path (False: plain interpolation, no low-pass when shrinking)."""

    size: object = 224
    scale: tuple = (0.08, 1.0)
    ratio: tuple = (3.0 / 4.0, 4.0 / 3.0)
    interpolation: object = "bilinear"
    antialias: object = True
    resizes = True
    role, stage, stream = "crop", 1, 1

    def __post_init__(self):
        object.__setattr__(self, "size", _pair(self.size, "RandomResizedCrop"))
        _set_filter(self, "RandomResizedCrop")
        s0, s1 = map(float, self.scale)
        r0, r1 = map(float, self.ratio)
        if not (0 < s0 <= s1) or not (0 < r0 <= r1):
            raise ValueError(f"RandomResizedCrop: scale {self.scale} and ratio {self.ratio} "
                             f"must be increasing pairs of positive numbers")
        object.__setattr__(self, "scale", (s0, s1))
        object.__setattr__(self, "ratio", (r0, r1))

    def boxes(self, heights, widths, draws, indices) -> np.ndarray:
        """(N, 4) int64 boxes (top, left, height, width) for the given samples."""
        hs, ws = _as_int64(heights, widths)
        u = draws(self.stream, indices, 4 * _ATTEMPTS)
        u = u.reshape(len(hs), _ATTEMPTS, 4)
        area = (hs * ws).astype(np.float64)[:, None]
        target = area * (self.scale[0] + u[..., 0] * (self.scale[1] - self.scale[0]))
        lr0, lr1 = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = np.exp(lr0 + u[..., 1] * (lr1 - lr0))
        cw = np.rint(np.sqrt(target * aspect)).astype(np.int64)
        ch = np.rint(np.sqrt(target / aspect)).astype(np.int64)
        ok = (cw > 0) & (cw <= ws[:, None]) & (ch > 0) & (ch <= hs[:, None])
        first = np.argmax(ok, axis=1)
        rows = np.arange(len(hs))
        found = ok[rows, first]
        bh, bw = ch[rows, first], cw[rows, first]
        top = np.floor(u[rows, first, 2] * (hs - bh + 1)).astype(np.int64)
        left = np.floor(u[rows, first, 3] * (ws - bw + 1)).astype(np.int64)
        out = np.stack([top, left, bh, bw], axis=1)
        return np.where(found[:, None], out, self._fallback(hs, ws))

    def _fallback(self, hs: np.ndarray, ws: np.ndarray) -> np.ndarray:
        """torchvision's central crop when 10 tries found no box."""
        in_ratio = ws / hs
        lo, hi = self.ratio
        w = np.where(in_ratio < lo, ws, np.where(in_ratio > hi, np.rint(hs * hi), ws))
        h = np.where(in_ratio < lo, np.rint(ws / lo), hs)
        w, h = w.astype(np.int64), h.astype(np.int64)
        return np.stack([(hs - h) // 2, (ws - w) // 2, h, w], axis=1)


@dataclass(frozen=True)
class RandomCrop:
    """A ``size`` box at a uniformly random position (the image must be at least ``size``)."""

    size: object = 224
    resizes = False
    role, stage, stream = "crop", 1, 1

    def __post_init__(self):
        object.__setattr__(self, "size", _pair(self.size, "RandomCrop"))

    def corners(self, hs, ws, draws, indices) -> tuple[np.ndarray, np.ndarray]:
        """(top, left) of the box in images of sizes (hs, ws)."""
        _check_fits("RandomCrop", self.size, hs, ws, indices)
        u = draws(self.stream, indices, 2)
        top = np.floor(u[:, 0] * (hs - self.size[0] + 1)).astype(np.int64)
        left = np.floor(u[:, 1] * (ws - self.size[1] + 1)).astype(np.int64)
        return top, left

    def boxes(self, heights, widths, draws, indices) -> np.ndarray:
        """(N, 4) int64 boxes (top, left, height, width)."""
        hs, ws = _as_int64(heights, widths)
        top, left = self.corners(hs, ws, draws, indices)
        return np.stack([top, left, np.full_like(hs, self.size[0]),
                         np.full_like(ws, self.size[1])], axis=1)


@dataclass(frozen=True)
class CenterCrop:
    """The centred ``size`` box, ``top = round((H - h) / 2)`` as torchvision rounds it."""

    size: object = 224
    resizes = False
    role, stage, stream = "crop", 1, None

    def __post_init__(self):
        object.__setattr__(self, "size", _pair(self.size, "CenterCrop"))

    def corners(self, hs, ws, draws, indices) -> tuple[np.ndarray, np.ndarray]:
        """(top, left) of the box in images of sizes (hs, ws); no randomness."""
        _check_fits("CenterCrop", self.size, hs, ws, indices)
        top = np.rint((hs - self.size[0]) / 2.0).astype(np.int64)
        left = np.rint((ws - self.size[1]) / 2.0).astype(np.int64)
        return top, left

    def boxes(self, heights, widths, draws, indices) -> np.ndarray:
        """(N, 4) int64 boxes (top, left, height, width)."""
        hs, ws = _as_int64(heights, widths)
        top, left = self.corners(hs, ws, draws, indices)
        return np.stack([top, left, np.full_like(hs, self.size[0]),
                         np.full_like(ws, self.size[1])], axis=1)


@dataclass(frozen=True)
class Resize:
    """torchvision's Resize: an int ``size`` scales the shorter side to it (the longer side
    becomes ``int(size * long / short)``), a ``(h, w)`` pair gives that exact size.
    ``interpolation`` ("bilinear", "bicubic", "nearest") and ``antialias`` with
    torchvision's meanings. ``max_size`` (with an int size): the longer side is at most
    that, torchvision's rule (detection's ``Resize(800, max_size=1333)``). ``Resize(int)``
    needs CenterCrop / RandomCrop after it, or ``Output(pad=True)`` (reader/batch/plan.py pads)."""

    size: object = 256
    interpolation: object = "bilinear"
    antialias: object = True
    max_size: object = None
    role, stage, stream = "resize", 0, None

    def __post_init__(self):
        _set_filter(self, "Resize")
        if isinstance(self.size, (tuple, list)):
            object.__setattr__(self, "size", _pair(self.size, "Resize"))
        elif int(self.size) < 1:
            raise ValueError(f"Resize: size {self.size!r} must be >= 1 pixel")
        else:
            object.__setattr__(self, "size", int(self.size))
        m = self.max_size
        if m is not None and (isinstance(self.size, tuple) or isinstance(m, bool) or
                              not isinstance(m, numbers.Integral) or int(m) <= self.size):
            raise ValueError(f"Resize: max_size={m!r}: expected an int number of pixels, with "
                             f"an int size smaller than it (torchvision's rule); got "
                             f"size={self.size!r}")

    def resized_shape(self, hs: np.ndarray, ws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(heights, widths) of the resized images, torchvision's rounding."""
        if isinstance(self.size, tuple):
            return np.full_like(hs, self.size[0]), np.full_like(ws, self.size[1])
        s = self.size
        short, long_ = np.minimum(hs, ws), np.maximum(hs, ws)
        new_long = (s * long_.astype(np.float64) / short).astype(np.int64)  # int(): truncates
        if self.max_size is not None:
            over = new_long > self.max_size  # torchvision: the long side becomes max_size
            s = np.where(over, (self.max_size * s / np.maximum(new_long, 1)).astype(np.int64), s)
            new_long = np.where(over, int(self.max_size), new_long)
        return np.where(hs <= ws, s, new_long), np.where(hs <= ws, new_long, s)


@dataclass(frozen=True)
class ResizeThenCrop:
    """``Resize`` followed by ``CenterCrop``/``RandomCrop`` (or alone with a fixed size),
    fused: the crop's box in the resized image is mapped back to the stored image (an exact,
    fractional box) and resampled once. On the host the filter reads around the box as
    resizing the whole image and cropping does (same pixels up to rounding); the GPU
    kernel resamples the box rounded to whole stored pixels (a shift of < 0.5 pixel)."""

    resize: Resize
    crop: object = None   # CenterCrop, RandomCrop or None (Resize((h, w)) alone)
    resizes = True

    @property
    def size(self) -> tuple[int, int]:
        """Output (height, width)."""
        return self.crop.size if self.crop is not None else self.resize.size

    @property
    def interpolation(self) -> str:
        """The Resize's interpolation."""
        return self.resize.interpolation

    @property
    def antialias(self) -> bool:
        """The Resize's antialias."""
        return self.resize.antialias

    def exact_boxes(self, heights, widths, draws, indices) -> np.ndarray:
        """(N, 4) float64 boxes (top, left, height, width): the crop of the resized image
        mapped back to the stored image, exactly."""
        hs, ws = _as_int64(heights, widths)
        if self.crop is None:
            return np.stack([np.zeros_like(hs), np.zeros_like(ws), hs, ws], axis=1).astype(float)
        nh, nw = self.resize.resized_shape(hs, ws)
        top, left = self.crop.corners(nh, nw, draws, indices)
        sy, sx = hs / nh, ws / nw
        return np.stack([top * sy, left * sx, self.size[0] * sy, self.size[1] * sx], axis=1)

    def boxes(self, heights, widths, draws, indices) -> np.ndarray:
        """(N, 4) int64 boxes (top, left, height, width): the exact boxes rounded to whole
        stored pixels (what the GPU kernel resamples: a shift of < 0.5 stored pixel)."""
        hs, ws = _as_int64(heights, widths)
        exact = self.exact_boxes(hs, ws, draws, indices)
        return round_boxes(exact, hs, ws)


def round_boxes(exact: np.ndarray, hs: np.ndarray, ws: np.ndarray) -> np.ndarray:
    """Float (top, left, h, w) boxes rounded to whole pixels inside (hs, ws) images."""
    t = np.clip(np.rint(exact[:, 0]).astype(np.int64), 0, hs - 1)
    lf = np.clip(np.rint(exact[:, 1]).astype(np.int64), 0, ws - 1)
    bh = np.clip(np.rint(exact[:, 2]).astype(np.int64), 1, hs - t)
    bw = np.clip(np.rint(exact[:, 3]).astype(np.int64), 1, ws - lf)
    return np.stack([t, lf, bh, bw], axis=1)


def decode_windows(exact: np.ndarray, out_size, hs: np.ndarray, ws: np.ndarray) -> np.ndarray:
    """Whole-pixel (top, left, h, w) windows around exact boxes, wide enough for the
    resampling filter's support (1 output pixel's footprint, at least 1 pixel, plus 1)."""
    my = np.ceil(np.maximum(exact[:, 2] / out_size[0], 1.0)) + 1
    mx = np.ceil(np.maximum(exact[:, 3] / out_size[1], 1.0)) + 1
    t = np.maximum(np.floor(exact[:, 0] - my), 0).astype(np.int64)
    lf = np.maximum(np.floor(exact[:, 1] - mx), 0).astype(np.int64)
    b = np.minimum(np.ceil(exact[:, 0] + exact[:, 2] + my), hs).astype(np.int64)
    r = np.minimum(np.ceil(exact[:, 1] + exact[:, 3] + mx), ws).astype(np.int64)
    return np.stack([t, lf, b - t, r - lf], axis=1)


def _probability(name: str, p) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}(p={p}): a probability in [0, 1] was expected")
    return p


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``."""

    p: float = 0.5
    role, stage, stream = "flip_h", 2, 2

    def __post_init__(self):
        object.__setattr__(self, "p", _probability("RandomHorizontalFlip", self.p))


@dataclass(frozen=True)
class RandomVerticalFlip:
    """Mirror top-bottom with probability ``p``."""

    p: float = 0.5
    role, stage, stream = "flip_v", 2, 3

    def __post_init__(self):
        object.__setattr__(self, "p", _probability("RandomVerticalFlip", self.p))


CROPS = (RandomResizedCrop, RandomCrop, CenterCrop)


# ---- boxes and masks follow the pixels ---------------------------------------------------
# A sample's geometry is the source box (top, left, height, width) its image was resampled
# from (fractional for Resize + crop on the host, whole pixels otherwise), its true output
# size (oh, ow) and its two flips. As torchvision's transforms.v2:
#   * boxes (x0, y0, x1, y1) in pixels of the stored upright image map to
#     x' = (x - left) * ow / width (rows alike), are clipped to the output, mirrored by a
#     flip (x' -> ow - x'), and removed when less than MIN_BOX_SIZE wide or high (with their
#     per-box fields: SanitizeBoundingBoxes' min_size=1);
#   * masks are resampled nearest-neighbour: output row y reads source row
#     floor(top + (y + 0.5) * height / oh) (the pixel under the output pixel's centre, PIL's
#     and torchvision's NEAREST_EXACT), clamped into the mask; a flip reverses the table,
#     padding is -1. The same tables drive the GPU kernel (dlpack_io.kernels.mask_gather),
#     so both paths give identical masks.


def sample_geometry(params, on_device: bool):
    """(source boxes (N, 4) float64 top/left/height/width, output sizes (N, 2) int64) of
    a batch's ``SampleParams``: the fractional boxes the host resamples from, or the whole
    pixel boxes the GPU kernel reads (``on_device``)."""
    src = params.exact if params.exact is not None and not on_device else params.boxes
    src = np.asarray(src, dtype=np.float64)
    if params.sizes is not None:
        sizes = np.asarray(params.sizes, np.int64)
    else:
        sizes = np.tile(np.asarray(params.out_size, np.int64), (len(src), 1))
    return src, sizes


def map_boxes(boxes: np.ndarray, owner: np.ndarray, src, sizes, flip_h, flip_v) -> np.ndarray:
    """(n, 4) float64 boxes (x0, y0, x1, y1) of a whole batch after their sample's crop /
    resize ``src[owner]`` -> ``sizes[owner]``, clipped to the output and flipped (one
    vectorised pass; ``owner`` is each box's row in the batch)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    top, left, bh, bw = (np.asarray(src, np.float64)[owner, k][:, None] for k in range(4))
    oh = np.asarray(sizes, np.float64)[owner, 0][:, None]
    ow = np.asarray(sizes, np.float64)[owner, 1][:, None]
    x = np.minimum(np.maximum((b[:, 0::2] - left) * (ow / bw), 0.0), ow)
    y = np.minimum(np.maximum((b[:, 1::2] - top) * (oh / bh), 0.0), oh)
    x = np.where(np.asarray(flip_h, bool)[owner][:, None], ow - x[:, ::-1], x)
    y = np.where(np.asarray(flip_v, bool)[owner][:, None], oh - y[:, ::-1], y)
    return np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1)


def kept(mapped: np.ndarray) -> np.ndarray:
    """(n,) bool: boxes at least MIN_BOX_SIZE wide and high (the rest are removed)."""
    return ((mapped[:, 2] - mapped[:, 0]) >= MIN_BOX_SIZE) & \
        ((mapped[:, 3] - mapped[:, 1]) >= MIN_BOX_SIZE)


def nearest_table(start: float, length: float, out_len: int, src_len: int, flip: bool,
                  padded_len: int) -> np.ndarray:
    """(padded_len,) int32: the source index of each output row (or column), -1 past
    ``out_len`` (padding)."""
    centres = start + (np.arange(out_len, dtype=np.float64) + 0.5) * (length / out_len)
    idx = np.clip(np.floor(centres), 0, src_len - 1).astype(np.int32)
    table = np.full(padded_len, -1, dtype=np.int32)
    table[:out_len] = idx[::-1] if flip else idx
    return table


def mask_tables(src, sizes, flip_h, flip_v, heights, widths, out_size):
    """(rows (N, OH), cols (N, OW)) int32 tables of a batch (see :func:`nearest_table`)."""
    n = len(src)
    rows = np.empty((n, out_size[0]), dtype=np.int32)
    cols = np.empty((n, out_size[1]), dtype=np.int32)
    for i in range(n):
        top, left, bh, bw = (float(v) for v in src[i])
        rows[i] = nearest_table(top, bh, int(sizes[i, 0]), int(heights[i]), bool(flip_v[i]),
                                out_size[0])
        cols[i] = nearest_table(left, bw, int(sizes[i, 1]), int(widths[i]), bool(flip_h[i]),
                                out_size[1])
    return rows, cols


def gather_masks(masks, rows: np.ndarray, cols: np.ndarray, fill: int, dtype) -> np.ndarray:
    """(N, OH, OW) masks through their tables on the host (what the kernel computes)."""
    out = np.full((len(masks), rows.shape[1], cols.shape[1]), fill, dtype=dtype)
    for i, mask in enumerate(masks):
        r, c = rows[i], cols[i]
        nr, nc = int(np.count_nonzero(r >= 0)), int(np.count_nonzero(c >= 0))
        # padding (-1) only ever follows the image's rows and columns: a plain slice
        out[i, :nr, :nc] = mask.take(r[:nr], axis=0).take(c[:nc], axis=1)  # 10x fancy
    return out
