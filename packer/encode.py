"""Turn one input file into one record payload (runs in the packer's worker processes).

The rule, the same in both modes: **every record decodes to exactly the upright RGB pixels
Pillow gives for the input**, ``ImageOps.exif_transpose(Image.open(f)).convert("RGB")``.
  * ``jpeg`` mode stores the original bytes of every JPEG the reader's decoder can decode
    (YCbCr/RGB, grayscale, CMYK, YCCK; baseline or progressive; any EXIF orientation). The
    index records the EXIF orientation and the stored colour so the reader turns the image
    upright and converts it to RGB when it decodes; height and width are the upright size.
  * Only a resize asked for (--max-side) or a JPEG that PIL decodes but the reader's
    decoder cannot is decoded and re-encoded at --quality; the manifest counts these per
    reason under ``reencoded``.
  * Other image formats (PNG, WebP, BMP, TIFF, GIF, also when named .jpg: the content
    decides) follow --non-jpeg: ``keep`` (default) stores a PNG or WebP file as it is
    (KIND_FILE: its compression kept, so a PNG set keeps its size; the reader decodes it
    with PIL to the very pixels a raw record holds) when it is smaller than its raw pixels
    and nothing resizes it, and the others as ``raw`` does; ``raw`` stores their upright
    RGB pixels losslessly as a raw record (no decode on read, larger), ``jpeg`` re-encodes
    them at --quality, ``reject`` skips them.
  * ``raw`` mode stores the same upright RGB pixels, resized as asked.
  * An image over --max-pixels (width x height) is rejected before any pixel is decoded;
    a file that cannot be decoded (truncated, zero bytes, not an image) is rejected with
    the reason; with validation on, JPEG bytes are fully entropy-decoded by the reader's own
    decoder to prove them.
  * With ``restarts`` (``--restart-markers``), every baseline 3-component JPEG record is
    rewritten losslessly (same DCT coefficients, so the same pixels) with a restart marker
    after every MCU, so the reader can Huffman-decode only the MCUs around a crop
    (reader/_jpeg.c); counted under ``lossless``. The rewrite entropy-decodes every
    coefficient, so it also validates. Other JPEGs are kept as they are.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import stat

import numpy as np

from dlpack_io.packer.options import PackOptions
from dlpack_io.packer.pilimage import (draft_for, exif_orientation, full_decode, open_image,
                                       resize, upright_rgb)
from dlpack_io.packer.records import BAD_INPUT, EncodedRecord, RejectedInput
from dlpack_io.reader.format import (COLOUR_CMYK, COLOUR_GRAY, COLOUR_YCC, KIND_FILE, KIND_JPEG,
                                     KIND_RAW, crc32)
from dlpack_io.reader.format.native import native_jpeg
from dlpack_io.reader.format.regular import open_input

# PIL mode of a JPEG -> the stored colour the reader converts from; other modes re-encode.
_COLOURS = {"RGB": COLOUR_YCC, "L": COLOUR_GRAY, "CMYK": COLOUR_CMYK}
KEPT_FORMATS = ("PNG", "WEBP")  # --non-jpeg keep: stored as their own file (KIND_FILE)


def _reader_decode_error(data: bytes, height: int, width: int) -> str | None:
    """Entropy-decode every coefficient with the reader's own decoder (C extension, at 1/8
    scale: the IDCT is nearly free); the error text, or None when it decodes."""
    jpeg = native_jpeg()
    if jpeg is None:
        return None
    out = np.empty((height // 8 + 2) * (width // 8 + 2) * 3, dtype=np.uint8)
    try:  # (payload, out, top, left, height, width, scale_num, pixel_size)
        jpeg.decode_region(data, out, 0, 0, height, width, 1, 3)
    except ValueError as exc:
        return str(exc)
    return None


RESTARTS_ADDED = "restart markers added (lossless)"


def _add_restarts(data: bytes) -> bytes | None:
    """``data`` rewritten with a restart marker per MCU, or None to keep it (progressive,
    not 3-component, or already so); RejectedInput when it does not decode."""
    try:
        return native_jpeg().add_restarts(data)
    except ValueError as exc:
        raise RejectedInput(f"cannot decode JPEG: {exc}") from None


def _keep_jpeg(data: bytes, img, orientation: int, validate: bool, restarts: bool):
    """The record of a JPEG kept as it is (or rewritten with restart markers), or None
    when the reader's decoder cannot decode what PIL can (the caller re-encodes it)."""
    width, height = img.size
    upright = (height, width) if orientation < 5 else (width, height)
    keep = dict(height=upright[0], width=upright[1], kind=KIND_JPEG, orientation=orientation,
                colour=_COLOURS[img.mode])
    if restarts:  # decodes every coefficient: validates too
        rewritten = _add_restarts(data)
        if rewritten is not None:
            return EncodedRecord(rewritten, lossless=RESTARTS_ADDED, **keep)
    if validate and native_jpeg() is not None:
        if _reader_decode_error(data, height, width) is not None:
            full_decode(img)  # rejects what PIL cannot decode either
            return None
    elif validate:  # PIL is the reader's decoder: entropy-decode all, IDCT at 1/8 scale
        img.draft("RGB", (1, 1))
        full_decode(img)
    return EncodedRecord(data, **keep)


def _reencode_jpeg(img, why: str, max_side, quality: int, restarts: bool) -> EncodedRecord:
    """Decode, turn upright, convert to RGB, resize as asked, encode at ``quality``."""
    draft_for(img, None, max_side)
    img = resize(upright_rgb(img), None, max_side)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    payload = out.getvalue()
    if restarts:
        payload = _add_restarts(payload) or payload
    return EncodedRecord(payload, img.size[1], img.size[0], KIND_JPEG, why)


def _non_jpeg(img, data: bytes, *, mode, size, max_side, quality, non_jpeg) -> EncodedRecord:
    """Another image format (whatever the file's name says): per --non-jpeg, its own file
    (keep: a PNG or WebP smaller than its pixels, not resized), its upright RGB pixels as a
    raw record (lossless), re-encoded as JPEG, or rejected."""
    kind = img.format or "unknown"
    if non_jpeg == "reject":
        raise RejectedInput(f"{kind} image, not a JPEG (--non-jpeg reject)")
    upright = upright_rgb(img)  # every pixel decoded: the file is proven whole
    pixels = resize(upright, size, max_side)
    resized = pixels.size != upright.size
    if mode == "raw":
        return EncodedRecord(pixels.tobytes(), pixels.size[1], pixels.size[0], KIND_RAW)
    if non_jpeg == "keep" and not resized and kind in KEPT_FORMATS and \
            len(data) < 3 * pixels.size[0] * pixels.size[1]:
        return EncodedRecord(data, pixels.size[1], pixels.size[0], KIND_FILE)
    if non_jpeg in ("raw", "keep"):
        if resized:
            return EncodedRecord(pixels.tobytes(), pixels.size[1], pixels.size[0], KIND_RAW,
                                 f"{kind} image resized (--max-side), stored as raw pixels")
        return EncodedRecord(pixels.tobytes(), pixels.size[1], pixels.size[0], KIND_RAW,
                             lossless=f"{kind} image stored as raw pixels")
    out = io.BytesIO()
    pixels.save(out, format="JPEG", quality=quality)
    return EncodedRecord(out.getvalue(), pixels.size[1], pixels.size[0], KIND_JPEG,
                         f"{kind} image re-encoded as JPEG (--non-jpeg jpeg)")


def encode_file(data: bytes, *, mode: str, size=None, max_side=None,
                quality=PackOptions.quality, validate=PackOptions.validate, restarts=False,
                non_jpeg=PackOptions.non_jpeg,
                max_pixels=PackOptions.max_pixels) -> EncodedRecord:
    """Encode the bytes of one input file as a record; raise RejectedInput if impossible.

    The defaults are PackOptions' (one set of defaults), except ``restarts``, which
    PackOptions turns on only where the C extension is there (its ``jpeg_restarts``)."""
    img = open_image(data, max_pixels)
    if img.format != "JPEG":
        return _non_jpeg(img, data, mode=mode, size=size, max_side=max_side, quality=quality,
                         non_jpeg=non_jpeg)
    if mode == "jpeg":
        if max_side is not None and max(img.size) > max_side:
            why = "resized (--max-side)"
        elif img.mode not in _COLOURS:
            why = f"{img.mode} JPEG"
        else:
            record = _keep_jpeg(data, img, exif_orientation(img), validate, restarts)
            if record is not None:
                return record
            why = "JPEG that PIL decodes but the reader's decoder cannot"
        return _reencode_jpeg(img, why, max_side, quality, restarts)
    draft_for(img, size, max_side)
    img = resize(upright_rgb(img), size, max_side)
    return EncodedRecord(img.tobytes(), img.size[1], img.size[0], KIND_RAW)


def _read_unchanged(path: str, size: int, mtime_ns: int, *span) -> bytes:
    """Read a file, checking it is still the one the scan saw (size and mtime); with
    ``span`` (an offset), the ``size`` bytes there of a container (containers.py), whose
    mtime must be unchanged."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):  # FIFO, device (/dev/zero reads without end), ...
            raise RejectedInput("not a regular file (a FIFO, device or socket); only image "
                                "files are packed")
        data = os.pread(f.fileno(), size, span[0]) if span else f.read()
    if span and (st.st_mtime_ns, len(data)) != (mtime_ns, size):
        raise RejectedInput(f"{path} changed while packing (bytes {span[0]}..{span[0] + size} "
                            f"of it); re-run to pack its new content")
    if size >= 0 and not span and (st.st_size, st.st_mtime_ns, len(data)) != (size, mtime_ns, size):
        raise RejectedInput(f"file changed while packing (size {size} -> {st.st_size}, "
                            f"mtime changed: {st.st_mtime_ns != mtime_ns}); re-run to pack "
                            f"its new content")
    return data


def read_span(item: tuple) -> bytes:
    """The bytes of an encode item as they are now: the whole file, or (an item with an
    offset, a sample inside a container) its span."""
    path, size, _, *span = item
    fd, _ = open_input(path)  # a regular file, opened without blocking (a FIFO is refused)
    with open(fd, "rb") as f:
        return os.pread(f.fileno(), size, span[0]) if span else f.read()


def encode_path(item: tuple, options: dict, ship_passthrough: bool = True):
    """Worker entry point: read and encode one input; never raises for bad input.

    ``item`` is (path, size, mtime_ns) as scanned. Returns ``("ok", EncodedRecord)`` or
    ``("reject", reason)``. With ``ship_passthrough=False`` an untouched JPEG comes back
    without its payload (see EncodedRecord.crc).
    """
    path, size, mtime_ns, *span = item  # span: an offset into a container (containers.py)
    if size == BAD_INPUT:  # a reject found by the scan; mtime_ns holds its reason
        return "reject", str(mtime_ns)
    try:
        data = _read_unchanged(path, size, mtime_ns, *span)
        record = encode_file(data, **options)
        record = dataclasses.replace(record, source_bytes=len(data), crc=crc32(record.payload),
                                     source_sha=hashlib.sha256(data).hexdigest())
        if record.is_passthrough and not ship_passthrough:
            # The parent re-reads the file (page cache, ~40 us) and checks this CRC: cheaper
            # than pickling 110 KB through a pipe, and it catches a file changed meanwhile.
            record = dataclasses.replace(record, payload=None)
        return "ok", record
    except RejectedInput as exc:
        return "reject", str(exc)
    except OSError as exc:
        return "reject", f"cannot read file: {exc.strerror or exc}"
    except Exception as exc:  # a decoder bug must not kill a long conversion
        return "reject", f"{type(exc).__name__}: {exc}"
