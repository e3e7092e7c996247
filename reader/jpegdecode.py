"""Decode just what a crop needs from a JPEG record: the box's rows and columns, at the
smallest DCT scale (1/8, 1/4, 1/2 or 1) that still gives at least the output size.

Two back ends with the same geometry:
  * the optional C extension ``dlpack_io.reader._jpeg`` (libjpeg-turbo's
    ``jpeg_crop_scanline`` + ``jpeg_skip_scanlines`` + DCT scaling, GIL released,
    writing into a caller-owned buffer): rows below the box are never entropy-decoded,
    rows above are entropy-decoded but skip the IDCT, columns outside the box (rounded
    to iMCU boundaries) skip IDCT, upsampling and colour conversion; in records packed
    with ``--restart-markers`` (a restart marker per MCU) only the MCUs around the box
    are entropy-decoded at all, with bit-identical box pixels;
  * PIL (always available): ``Image.draft`` picks the same DCT scale, the whole image
    is decoded at that scale.

What reduced-scale decoding changes: the DCT-domain downscale averages each 8x8 block's
frequencies instead of the antialiased bilinear filter, so resized crops differ from
"full decode, then resize" by about 1 grey level on average (docs/loader.md has the
measured figures). Pass ``reduce=False`` for full-scale decoding of the box.
"""
from __future__ import annotations

import io
import logging
import math

import numpy as np

from dlpack_io.reader import resample as resample_mod
from dlpack_io.reader import shard
from dlpack_io.reader.format.spec import PLANES_MAGIC, native_jpeg
from dlpack_io.reader.resample import DEFAULT as DEFAULT_RESAMPLE

log = logging.getLogger(__name__)

# Looked up once: the decoders below branch on it per record. DLPACK_IO_NO_JPEG_EXT=1 (the
# rule lives in format/spec.py, shared with the packer) forces the PIL path.
_jpeg = native_jpeg()
if _jpeg is None:
    log.debug("dlpack_io.reader._jpeg unavailable (not built, or DLPACK_IO_NO_JPEG_EXT=1): "
              "decoding JPEGs with PIL")

# The C resize of resize_region(into=...) (_resize.c); None without the extension or with an
# in-place build older than it (that keeps working, through PIL). Benchmarks set it to None
# to time the PIL resize.
native_resize = getattr(_jpeg, "resize", None)
# decode_region + that resize in one C call (one release of the GIL per sample): what
# decode_resized(into=...) runs when the C resize would run anyway.
native_decode_resized = getattr(_jpeg, "decode_resized", None)
# decode_resized for many records of mapped shards in one call (the batch path's common case).
native_decode_resized_many = getattr(_jpeg, "decode_resized_many", None)

SCALES = (1, 2, 4, 8)  # numerators over 8 with SIMD IDCTs in libjpeg-turbo


def have_extension() -> bool:
    """True when the C region decoder is importable."""
    return _jpeg is not None


def backend_name() -> str:
    """``"libjpeg-turbo region decoder (C extension)"`` or ``"PIL"``."""
    return "libjpeg-turbo region decoder (C extension)" if _jpeg is not None else "PIL"


def choose_scale(box_h: int, box_w: int, out_h: int, out_w: int) -> int:
    """Smallest numerator n in SCALES with the box at n/8 scale >= the output size."""
    for n in SCALES:
        if box_h * n >= out_h * 8 and box_w * n >= out_w * 8:
            return n
    return 8


def choose_scales(box_h: np.ndarray, box_w: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """:func:`choose_scale` of many boxes (int64 arrays) at once."""
    out = np.full(len(box_h), 8, dtype=np.int64)
    for n in SCALES[::-1]:  # the smallest that fits is written last
        fits = (box_h * n >= out_h * 8) & (box_w * n >= out_w * 8)
        out[fits] = n
    return out


# Pillow's ImageOps.exif_transpose method for each EXIF orientation (1: none).
EXIF_TRANSPOSE = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE",
                  6: "ROTATE_270", 7: "TRANSVERSE", 8: "ROTATE_90"}
# (transpose, flip rows, flip columns) taking the upright image back to the stored one:
# upright (y, x) is stored (sy, sx) with (u, v) = (x, y) if transpose else (y, x),
# sy = H - 1 - u if flip rows else u, sx = W - 1 - v if flip columns else v (as _jpeg.c).
ORIENTATION_MAP = {1: (0, 0, 0), 2: (0, 0, 1), 3: (0, 1, 1), 4: (0, 1, 0),
                   5: (1, 0, 0), 6: (1, 1, 0), 7: (1, 1, 1), 8: (1, 0, 1)}


def check_orientation(orientation) -> int:
    """``orientation`` as an int in 1..8, or ValueError."""
    o = int(orientation)
    if o not in ORIENTATION_MAP:
        raise ValueError(f"EXIF orientation {orientation!r}: expected 1..8")
    return o


class Region:
    """A decoded block of a JPEG at scale ``n``/8: ``pixels`` (rows, cols, 3 or 4) uint8
    (RGB, or RGBX from the C decoder) whose top-left pixel is (y0, x0) in the scaled,
    upright image. ``buffer`` is a flat array starting with the block, possibly longer.
    ``dy, dx`` (in [0, 1), non-zero only at reduced scale along an axis that EXIF
    orientation mirrors): full-size coordinate c maps to c * n / 8 + d in the scaled image,
    because libjpeg rounds the scaled size up at the stored image's far edge."""

    __slots__ = ("pixels", "y0", "x0", "n", "buffer", "dy", "dx")

    def __init__(self, pixels, y0, x0, n, buffer=None, dy=0.0, dx=0.0):
        self.pixels, self.y0, self.x0, self.n = pixels, y0, x0, n
        self.buffer = pixels.reshape(-1) if buffer is None else buffer
        self.dy, self.dx = dy, dx

    def box(self, box) -> tuple[float, float, float, float]:
        """The full-size box (top, left, h, w) as a PIL box (x0, y0, x1, y1) in ``pixels``."""
        top, left, h, w = box
        f = self.n / 8.0
        oy, ox = self.y0 - self.dy, self.x0 - self.dx
        rows, cols = self.pixels.shape[:2]
        return (max(left * f - ox, 0.0), max(top * f - oy, 0.0),
                min((left + w) * f - ox, float(cols)), min((top + h) * f - oy, float(rows)))

    def int_box(self, box) -> tuple[int, int, int, int]:
        """The box in ``pixels`` rounded to whole pixels, as (top, left, h, w)."""
        x0, y0, x1, y1 = self.box(box)
        rows, cols = self.pixels.shape[:2]
        top, left = min(int(round(y0)), rows - 1), min(int(round(x0)), cols - 1)
        return top, left, max(1, min(int(round(y1)), rows) - top), max(1, min(int(round(x1)), cols) - left)


def scratch_bytes(height: int, width: int) -> int:
    """Scratch a full-size RGBX decode of a height x width JPEG needs (with row slack);
    also elementwise, on int64 arrays."""
    return (height + 1) * width * 4 + 64


def _mirror_offsets(orientation: int, n: int, scaled, full) -> tuple[float, float]:
    """(dy, dx) of Region for the upright axes that orientation mirrors (see Region)."""
    t, fy, fx = ORIENTATION_MAP[orientation]
    flip_rows, flip_cols = (fx, fy) if t else (fy, fx)
    f = n / 8.0
    return (scaled[0] - full[0] * f if flip_rows else 0.0,
            scaled[1] - full[1] * f if flip_cols else 0.0)


def decode_region(payload, box, n: int, scratch: np.ndarray, pixel_size: int = 3,
                  orientation: int = 1) -> Region:
    """Decode the full-size ``box`` (top, left, h, w) at scale n/8.

    ``payload`` is a JPEG record's, or a decoded-planes record's (KIND_PLANES: ``n`` must
    be 8, the C extension is needed; the pixels are the very ones of its JPEG).

    ``orientation`` is the record's EXIF orientation (its index entry's ``orientation``):
    the box and the result are in the upright image, pixel-identical to Pillow's
    ``ImageOps.exif_transpose``; grayscale, CMYK and YCCK JPEGs come out as RGB exactly as
    Pillow's ``convert("RGB")`` gives them. With the C extension the pixels land in
    ``scratch`` (at least ``scratch_bytes(H, W)``), as RGB or, with ``pixel_size=4``, RGBX;
    the PIL fallback returns a fresh RGB array whatever ``pixel_size`` says.
    """
    top, left, h, w = (int(v) for v in box)
    orientation = check_orientation(orientation)
    if _jpeg is not None:
        y0, x0, rows, cols, sh, sw, ih, iw = _jpeg.decode_region(
            payload, scratch, top, left, h, w, n, pixel_size, orientation)
        px = scratch[:rows * cols * pixel_size].reshape(rows, cols, pixel_size)
        dy, dx = _mirror_offsets(orientation, n, (sh, sw), (ih, iw)) if n < 8 else (0.0, 0.0)
        return Region(px, y0, x0, n, scratch, dy, dx)
    return _decode_region_pil(payload, top, left, h, w, n, orientation)


def _decode_region_pil(payload, top, left, h, w, n, orientation=1) -> Region:
    if bytes(payload[:len(PLANES_MAGIC)]) == PLANES_MAGIC:
        raise ValueError("decoded-planes record: reading one needs the C extension "
                         "dlpack_io.reader._jpeg, which is not built here (install the libjpeg "
                         "headers and reinstall dlpack-io)")
    try:
        return _decode_region_pil_unchecked(payload, top, left, h, w, n, orientation)
    except (OSError, SyntaxError, ValueError) as exc:  # what PIL raises on bad data
        raise ValueError(f"JPEG decode error (PIL): {type(exc).__name__}: {exc}") from exc


def _decode_region_pil_unchecked(payload, top, left, h, w, n, orientation) -> Region:
    from PIL import Image

    img = Image.open(io.BytesIO(payload))
    t = ORIENTATION_MAP[orientation][0]
    full_w, full_h = img.size[::-1] if t else img.size  # upright size
    if top < 0 or left < 0 or h < 1 or w < 1 or top + h > full_h or left + w > full_w:
        raise ValueError(f"crop box (top={top}, left={left}, height={h}, width={w}) is not "
                         f"inside the {full_h} x {full_w} image")
    if n < 8:
        k = 8 // n  # PIL picks the largest reduction k with full // (full // k) >= k
        img.draft("RGB", (max(1, img.width // k), max(1, img.height // k)))
        n = _draft_numerator(full_h, full_w, img.size[::-1] if t else img.size)
    if img.mode != "RGB":
        img = img.convert("RGB")
    if orientation != 1:
        img = img.transpose(getattr(Image.Transpose, EXIF_TRANSPOSE[orientation]))
    dy, dx = _mirror_offsets(orientation, n, (img.height, img.width), (full_h, full_w)) \
        if n < 8 else (0.0, 0.0)
    y0, x0 = int(top * n / 8 + dy), int(left * n / 8 + dx)
    y1 = min(math.ceil((top + h) * n / 8 + dy), img.height)
    x1 = min(math.ceil((left + w) * n / 8 + dx), img.width)
    pixels = np.asarray(img.crop((x0, y0, x1, y1)))
    return Region(pixels, y0, x0, n, None, dy, dx)


def _draft_numerator(full_h: int, full_w: int, size) -> int:
    """The n/8 scale PIL's draft mode chose, from the reduced image size."""
    for k in (8, 4, 2, 1):
        if size == (-(-full_w // k), -(-full_h // k)):
            return 8 // k
    raise ValueError(f"PIL draft gave size {size} for a {full_w}x{full_h} JPEG, not a 1/k scale")


def _box_image(region: Region, ix0: int, iy0: int, ix1: int, iy1: int):
    """A PIL image of pixels [iy0:iy1, ix0:ix1] (RGBX: shares the memory, RGB: one copy)."""
    from PIL import Image

    rows, cols, ps = region.pixels.shape
    mode = "RGBX" if ps == 4 else "RGB"
    start, stride = (iy0 * cols + ix0) * ps, cols * ps
    tail = region.buffer[start:]
    if tail.size < (iy1 - iy0) * stride:  # no room for the last row's stride: copy the box
        tail = np.ascontiguousarray(region.pixels[iy0:iy1, ix0:ix1]).reshape(-1)
        stride = (ix1 - ix0) * ps
    return Image.frombuffer(mode, (ix1 - ix0, iy1 - iy0), tail, "raw", mode, stride, 1)


def _window(region: Region, box, within_box: bool) -> tuple[int, int, int, int]:
    """The pixels (ix0, iy0, ix1, iy1) of ``region`` the filter may read for ``box``."""
    rows, cols, _ = region.pixels.shape
    x0, y0, x1, y1 = box
    ix0, iy0 = max(int(math.floor(x0)), 0), max(int(math.floor(y0)), 0)
    ix1, iy1 = min(int(math.ceil(x1)), cols), min(int(math.ceil(y1)), rows)
    if not within_box and ix1 > ix0 and iy1 > iy0:
        ix0, iy0, ix1, iy1 = 0, 0, cols, rows
    if ix1 <= ix0 or iy1 <= iy0:
        raise ValueError(f"resize: box {box} outside a {rows}x{cols} image")
    return ix0, iy0, ix1, iy1


def resize_region(region: Region, box, out_size, within_box: bool = True,
                  resample=DEFAULT_RESAMPLE, into=None) -> np.ndarray | None:
    """Antialiased bilinear resample (PIL BILINEAR) of the float ``box`` (x0, y0, x1, y1)
    of ``region.pixels`` to ``out_size`` (h, w); returns (oh, ow, 3 or 4) uint8.
    ``resample`` (interpolation, antialias) picks another filter (see reader/resample.py).

    ``within_box``: only pixels of the box (rounded out to whole pixels) are read, as
    torchvision's crop-then-resize and the GPU kernel do (PIL's ``box=`` alone would let
    the filter reach pixels beyond the box's edges). False: the filter may read the whole
    region around the box, as resizing a whole image and then cropping does (Resize+crop).

    ``into=(dst, offset, flip_h, flip_v)``: write the result into the contiguous uint8
    ``dst`` at byte ``offset`` as three CHW planes, flipped as asked, and return None. The
    default filter then runs in the C extension (``_resize.c``: plain Pillow 13's
    arithmetic, no PIL image, no copy; within 2 grey levels of Pillow-SIMD and Pillow <= 12).
    """
    ix0, iy0, ix1, iy1 = _window(region, box, within_box)
    x0, y0, x1, y1 = box
    local = (x0 - ix0, y0 - iy0, x1 - ix0, y1 - iy0)
    if into is not None and resizes_in_c(resample):
        _resize_native(region, (ix0, iy0, ix1, iy1), local, out_size, into)
        return None
    if not resample_mod.uses_pil(resample):
        out = resample_mod.interpolate_box(region.pixels[iy0:iy1, ix0:ix1], local, out_size,
                                           resample[0])
    else:
        img = _box_image(region, ix0, iy0, ix1, iy1)
        pil = img.resize((out_size[1], out_size[0]), resample_mod.pil_filter(resample[0]),
                         box=local)
        ps = region.pixels.shape[2]
        out = np.frombuffer(pil.tobytes(), dtype=np.uint8).reshape(out_size[0], out_size[1], ps)
    if into is None:
        return out
    dst, offset, flip_h, flip_v = into
    shard.to_chw_array(out, dst, offset, flip_h, flip_v)
    return None


def resizes_in_c(resample=DEFAULT_RESAMPLE) -> bool:
    """True when ``resize_region(..., into=...)`` runs the C resize for ``resample``: it
    reads its source under the SIGBUS guard, so a memory-mapped record needs no copy first
    (PIL's resize reads Python-land memory unguarded: callers copy for it)."""
    return native_resize is not None and tuple(resample) == DEFAULT_RESAMPLE


def _resize_native(region: Region, window, local, out_size, into) -> None:
    """The C resample of ``local`` (a box in ``window`` of region.pixels) into ``into``."""
    ix0, iy0, ix1, iy1 = window
    cols, ps = region.pixels.shape[1:]
    dst, offset, flip_h, flip_v = into
    native_resize(region.buffer, (iy0 * cols + ix0) * ps, cols * ps, iy1 - iy0, ix1 - ix0,
                  ps, *local, int(out_size[0]), int(out_size[1]), dst, int(offset),
                  bool(flip_h), bool(flip_v))


def resize_box(pixels: np.ndarray, box, out_size, within_box: bool = True,
               resample=DEFAULT_RESAMPLE, into=None) -> np.ndarray | None:
    """:func:`resize_region` of a C-contiguous (h, w, 3) array (raw records)."""
    return resize_region(Region(np.ascontiguousarray(pixels), 0, 0, 8), box, out_size,
                         within_box, resample, into)


def decode_resized(payload, box, out_size, scratch: np.ndarray, reduce: bool = True,
                   exact_box=None, orientation: int = 1,
                   resample=DEFAULT_RESAMPLE, into=None) -> np.ndarray | None:
    """JPEG record -> the full-size ``box`` (top, left, h, w; in the upright image, see
    decode_region) resampled to ``out_size``: (oh, ow, 3 or 4). With ``exact_box`` (float
    top, left, h, w inside ``box``), ``box`` is only the window decoded around it and the
    filter may read all of that window (the resize-then-crop semantics of Resize +
    CenterCrop/RandomCrop). ``into``: written as CHW planes instead (see resize_region)."""
    target = box if exact_box is None else exact_box
    n = choose_scale(int(target[2]), int(target[3]), *out_size) if reduce else 8
    if into is not None and native_decode_resized is not None and resizes_in_c(resample):
        dst, offset, flip_h, flip_v = into
        top, left, h, w = (int(v) for v in box)
        native_decode_resized(payload, scratch, top, left, h, w, *(float(v) for v in target),
                              n, exact_box is None, int(out_size[0]), int(out_size[1]), dst,
                              int(offset), bool(flip_h), bool(flip_v),
                              check_orientation(orientation))
        return None
    region = decode_region(payload, box, n, scratch, pixel_size=4, orientation=orientation)
    return resize_region(region, region.box(target), out_size, within_box=exact_box is None,
                         resample=resample, into=into)
