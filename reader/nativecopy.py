"""Copies done by the C extension without the GIL, with numpy fallbacks of the same meaning:
a block of HWC pixels into CHW planes (flipped as asked), many such crops of one mapped shard
at once, byte ranges gathered into one buffer, and plain copies of mapped memory. The
extension turns a SIGBUS (a mapped file truncated under the read) into MappedFileError
(:func:`is_mapped_file_error`), so a shard cut short under a reader is an error naming it,
never a crash: every read of mapped memory that Python code keeps goes through here.
"""
from __future__ import annotations

import numpy as np

from dlpack_io.reader.format.native import native_jpeg

_jpeg = native_jpeg()  # looked up once (see format/native.py): branched on per record


def to_chw(src, offset: int, row_stride: int, h: int, w: int, dst: np.ndarray,
           dst_offset: int, flip_h: bool, flip_v: bool, pixel_size: int = 3) -> None:
    """Copy the (h, w) block of RGB (``pixel_size`` 3) or RGBX (4) pixels at byte
    ``offset`` of the contiguous buffer ``src`` (rows ``row_stride`` bytes apart) into the
    contiguous uint8 array ``dst`` at byte ``dst_offset`` as three (h, w) planes, flipped
    as asked."""
    if _jpeg is not None:
        _jpeg.to_chw(src, offset, row_stride, h, w, dst, dst_offset, bool(flip_h),
                     bool(flip_v), pixel_size)
        return
    flat = np.frombuffer(src, dtype=np.uint8)
    if min(h, w, offset) < 0 or row_stride < pixel_size * w or \
            offset + (h - 1) * row_stride + pixel_size * w > flat.size:
        raise ValueError(f"to_chw: a {h}x{w}x{pixel_size} block at offset {offset} (row "
                         f"stride {row_stride}) does not fit in a {flat.size}-byte buffer")
    block = np.lib.stride_tricks.as_strided(flat[offset:], (h, w, 3), (row_stride, pixel_size, 1),
                                            writeable=False)
    view = block[::-1] if flip_v else block
    view = view[:, ::-1] if flip_h else view
    out = dst.reshape(-1)[dst_offset:dst_offset + 3 * h * w].reshape(3, h, w)
    out[...] = view.transpose(2, 0, 1)


def to_chw_array(pixels: np.ndarray, dst: np.ndarray, dst_offset: int, flip_h, flip_v) -> None:
    """:func:`to_chw` of a whole C-contiguous (h, w, 3 or 4) array."""
    h, w, ps = pixels.shape
    to_chw(pixels, 0, w * ps, h, w, dst, dst_offset, flip_h, flip_v, ps)


def gather(src, src_offsets, lengths, dst: np.ndarray, dst_offsets) -> None:
    """Copy byte ranges ``src[src_offsets[i]:+lengths[i]]`` to ``dst[dst_offsets[i]:]``
    (one C call without the GIL; a numpy loop without the extension)."""
    so = np.ascontiguousarray(src_offsets, dtype=np.int64)
    ln = np.ascontiguousarray(lengths, dtype=np.int64)
    do = np.ascontiguousarray(dst_offsets, dtype=np.int64)
    if _jpeg is not None:
        _jpeg.gather(src, so, ln, dst, do)
        return
    flat = np.frombuffer(src, dtype=np.uint8)
    out = dst.reshape(-1)
    for a, n, b in zip(so.tolist(), ln.tolist(), do.tolist()):
        if a < 0 or b < 0 or a + n > flat.size or b + n > out.size:
            raise ValueError(f"gather: {n} bytes from {a} to {b} do not fit")
        out[b:b + n] = flat[a:a + n]


def crop_chw(src, params: np.ndarray, h: int, w: int, dst: np.ndarray) -> None:
    """:func:`to_chw` for many (h, w) RGB blocks of one buffer: ``params`` rows are
    (src_offset, row_stride, flip_h, flip_v, dst_offset); one C call without the GIL."""
    p = np.ascontiguousarray(params, dtype=np.int64)
    if _jpeg is not None:
        _jpeg.crop_chw(src, p, h, w, dst)
        return
    for off, stride, fh, fv, dst_off in p.tolist():
        to_chw(src, off, stride, h, w, dst, dst_off, fh, fv)


def is_mapped_file_error(exc: BaseException) -> bool:
    """True for the extension's MappedFileError: a SIGBUS turned into an exception because
    the mapped file was truncated under the read."""
    mapped = getattr(_jpeg, "MappedFileError", None)
    return mapped is not None and isinstance(exc, mapped)


_ZERO = np.zeros(1, dtype=np.int64)


def guarded_array(view) -> np.ndarray:
    """A writable uint8 copy of ``view``, made by the native code that turns a SIGBUS
    (the mapped file truncated under the read) into MappedFileError, a ValueError."""
    out = np.empty(len(view), dtype=np.uint8)
    if len(view):
        gather(view, _ZERO, np.array([len(view)], dtype=np.int64), out, _ZERO)
    return out


def guarded_copy(view) -> bytes:
    """bytes(view), copied under the SIGBUS guard (see guarded_array)."""
    return guarded_array(view).tobytes()
