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
    decides) follow --non-jpeg: ``raw`` (default) stores their upright RGB pixels
    losslessly as a raw record, ``jpeg`` re-encodes them at --quality, ``reject`` skips them.
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
import io
import os
import stat
import warnings
from dataclasses import dataclass

import numpy as np

from dlpack_io.packer.native import native
from dlpack_io.reader.format import (COLOUR_CMYK, COLOUR_GRAY, COLOUR_YCC, DEFAULT_MAX_PIXELS,
                                     KIND_JPEG, KIND_RAW, crc32)

NON_JPEG = ("raw", "jpeg", "reject")
_COLOURS = {"RGB": COLOUR_YCC, "L": COLOUR_GRAY, "CMYK": COLOUR_CMYK}


PIL_MISSING = ("no PIL provider is installed (dlpack needs one to read images): "
               "pip install 'dlpack-io[pillow]', or pillow-simd for faster resizing")


def require_pil() -> None:
    """Raise RuntimeError with the one-line fix when no PIL provider can be imported.

    Called before any work starts (``convert`` checks before scanning the folder)."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise RuntimeError(PIL_MISSING) from None


class RejectedInput(Exception):
    """An input file that cannot become a record; the message says why."""


@dataclass(frozen=True)
class EncodedRecord:
    """One record ready for a shard writer."""

    payload: bytes
    height: int                   # upright size
    width: int
    kind: int
    reencoded: str | None = None  # why the pixels were decoded and re-encoded (lossy)
    source_bytes: int = 0         # size of the input file, for MB/s figures
    crc: int = 0                  # CRC-32 of the payload, computed in the worker
    lossless: str | None = None   # lossless transform applied instead of the original bytes
    orientation: int = 1          # EXIF orientation the reader applies (jpeg records)
    colour: int = COLOUR_YCC      # format.COLOUR_* of a JPEG record's stored pixels

    @property
    def is_passthrough(self) -> bool:
        """True when the payload is the input file's bytes, untouched."""
        return self.kind == KIND_JPEG and self.reencoded is None and self.lossless is None


def _open(data: bytes, max_pixels: int):
    """PIL image of ``data`` (header only), rejected beyond ``max_pixels``."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise RejectedInput("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():  # our own limit below replaces Pillow's warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
            try:
                img = Image.open(io.BytesIO(data))
            finally:
                Image.MAX_IMAGE_PIXELS = limit
    except UnidentifiedImageError:
        raise RejectedInput("not an image PIL can identify") from None
    except Exception as exc:  # PIL raises many types on a damaged header
        raise RejectedInput(f"cannot read the image header: {exc}") from None
    w, h = img.size
    if w * h > max_pixels:
        raise RejectedInput(f"{w} x {h} = {w * h} pixels is more than --max-pixels "
                            f"{max_pixels} (decompression bomb guard); raise --max-pixels "
                            f"to pack it")
    return img


def _full_decode(img) -> None:
    """Decode every pixel; raises on truncated or corrupt data."""
    try:
        img.load()
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError...
        raise RejectedInput(f"cannot decode {img.format or 'image'}: {exc}") from None


def _reader_decode_error(data: bytes, height: int, width: int) -> str | None:
    """Entropy-decode every coefficient with the reader's own decoder (C extension, at 1/8
    scale: the IDCT is nearly free); the error text, or None when it decodes."""
    jpeg = native()
    if jpeg is None:
        return None
    out = np.empty((height // 8 + 2) * (width // 8 + 2) * 3, dtype=np.uint8)
    try:  # (payload, out, top, left, height, width, scale_num, pixel_size)
        jpeg.decode_region(data, out, 0, 0, height, width, 1, 3)
    except ValueError as exc:
        return str(exc)
    return None


def _orientation(img) -> int:
    try:
        value = int(img.getexif().get(0x0112, 1) or 1)
    except Exception:  # malformed EXIF blocks are common; Pillow then leaves it as it is
        return 1
    return value if 1 <= value <= 8 else 1  # exif_transpose ignores other values too


def _upright_rgb(img):
    from PIL import ImageOps

    _full_decode(img)
    img = ImageOps.exif_transpose(img)
    if img.mode != "RGB":
        img = img.convert("RGB")
    return img


def _target_size(w: int, h: int, size: int | None, max_side: int | None) -> tuple[int, int]:
    """Size to resize to before any center crop: shorter side = size, or longer <= max_side."""
    if size is not None:
        scale = size / min(w, h)
    elif max_side is not None and max(w, h) > max_side:
        scale = max_side / max(w, h)
    else:
        return w, h
    return max(1, round(w * scale)), max(1, round(h * scale))


def _resize(img, size: int | None, max_side: int | None):
    from PIL import Image

    w, h = img.size
    tw, th = _target_size(w, h, size, max_side)
    if (tw, th) != (w, h):
        img = img.resize((tw, th), Image.BILINEAR)
    if size is not None:
        left, top = (tw - size) // 2, (th - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return img


def _draft_for(img, size, max_side) -> None:
    """Let libjpeg decode at 1/2, 1/4 or 1/8 scale when the target is that much smaller."""
    if img.format == "JPEG" and (size or max_side):
        tw, th = _target_size(*img.size, size, max_side)
        img.draft("RGB", (tw, th))


RESTARTS_ADDED = "restart markers added (lossless)"


def _add_restarts(data: bytes) -> bytes | None:
    """``data`` rewritten with a restart marker per MCU, or None to keep it (progressive,
    not 3-component, or already so); RejectedInput when it does not decode."""
    try:
        return native().add_restarts(data)
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
    if validate and native() is not None:
        if _reader_decode_error(data, height, width) is not None:
            _full_decode(img)  # rejects what PIL cannot decode either
            return None
    elif validate:  # PIL is the reader's decoder: entropy-decode all, IDCT at 1/8 scale
        img.draft("RGB", (1, 1))
        _full_decode(img)
    return EncodedRecord(data, **keep)


def _reencode_jpeg(img, why: str, max_side, quality: int, restarts: bool) -> EncodedRecord:
    """Decode, turn upright, convert to RGB, resize as asked, encode at ``quality``."""
    _draft_for(img, None, max_side)
    img = _resize(_upright_rgb(img), None, max_side)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    payload = out.getvalue()
    if restarts:
        payload = _add_restarts(payload) or payload
    return EncodedRecord(payload, img.size[1], img.size[0], KIND_JPEG, why)


def _non_jpeg(img, *, mode, size, max_side, quality, non_jpeg) -> EncodedRecord:
    """Another image format (whatever the file's name says): per --non-jpeg, its upright
    RGB pixels as a raw record (lossless), re-encoded as JPEG, or rejected."""
    kind = img.format or "unknown"
    if non_jpeg == "reject":
        raise RejectedInput(f"{kind} image, not a JPEG (--non-jpeg reject)")
    upright = _upright_rgb(img)
    pixels = _resize(upright, size, max_side)
    resized = pixels.size != upright.size
    if mode == "raw":
        return EncodedRecord(pixels.tobytes(), pixels.size[1], pixels.size[0], KIND_RAW)
    if non_jpeg == "raw":
        if resized:
            return EncodedRecord(pixels.tobytes(), pixels.size[1], pixels.size[0], KIND_RAW,
                                 f"{kind} image resized (--max-side), stored as raw pixels")
        return EncodedRecord(pixels.tobytes(), pixels.size[1], pixels.size[0], KIND_RAW,
                             lossless=f"{kind} image stored as raw pixels")
    out = io.BytesIO()
    pixels.save(out, format="JPEG", quality=quality)
    return EncodedRecord(out.getvalue(), pixels.size[1], pixels.size[0], KIND_JPEG,
                         f"{kind} image re-encoded as JPEG (--non-jpeg jpeg)")


def encode_file(data: bytes, *, mode: str, size=None, max_side=None, quality=95,
                validate=True, restarts=False, non_jpeg="raw",
                max_pixels=DEFAULT_MAX_PIXELS) -> EncodedRecord:
    """Encode the bytes of one input file as a record; raise RejectedInput if impossible."""
    img = _open(data, max_pixels)
    if img.format != "JPEG":
        return _non_jpeg(img, mode=mode, size=size, max_side=max_side, quality=quality,
                         non_jpeg=non_jpeg)
    if mode == "jpeg":
        if max_side is not None and max(img.size) > max_side:
            why = "resized (--max-side)"
        elif img.mode not in _COLOURS:
            why = f"{img.mode} JPEG"
        else:
            record = _keep_jpeg(data, img, _orientation(img), validate, restarts)
            if record is not None:
                return record
            why = "JPEG that PIL decodes but the reader's decoder cannot"
        return _reencode_jpeg(img, why, max_side, quality, restarts)
    _draft_for(img, size, max_side)
    img = _resize(_upright_rgb(img), size, max_side)
    return EncodedRecord(img.tobytes(), img.size[1], img.size[0], KIND_RAW)


def _read_unchanged(path: str, size: int, mtime_ns: int) -> bytes:
    """Read a file, checking it is still the one the scan saw (size and mtime)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block
    with open(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):  # FIFO, device (/dev/zero reads without end), ...
            raise RejectedInput("not a regular file (a FIFO, device or socket); only image "
                                "files are packed")
        data = f.read()
    if size >= 0 and (st.st_size, st.st_mtime_ns, len(data)) != (size, mtime_ns, size):
        raise RejectedInput(f"file changed while packing (size {size} -> {st.st_size}, "
                            f"mtime changed: {st.st_mtime_ns != mtime_ns}); re-run to pack "
                            f"its new content")
    return data


def encode_path(item: tuple, options: dict, ship_passthrough: bool = True):
    """Worker entry point: read and encode one input; never raises for bad input.

    ``item`` is (path, size, mtime_ns) as scanned. Returns ``("ok", EncodedRecord)`` or
    ``("reject", reason)``. With ``ship_passthrough=False`` an untouched JPEG comes back
    without its payload (see EncodedRecord.crc).
    """
    path, size, mtime_ns = item
    try:
        data = _read_unchanged(path, size, mtime_ns)
        record = encode_file(data, **options)
        record = dataclasses.replace(record, source_bytes=len(data), crc=crc32(record.payload))
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
