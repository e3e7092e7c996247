"""Turn one input file into one record payload (runs in the packer's worker processes).

The rule for odd inputs, the same in both modes: **every record decodes to an upright,
3-channel RGB image.**
  * ``jpeg`` mode keeps the original bytes untouched when the file is a JPEG whose pixels
    are RGB (baseline or progressive) with no EXIF rotation and no resize asked for.
    Anything else that PIL can read (grayscale or CMYK JPEG, EXIF-rotated JPEG, PNG or WebP
    named .jpg, a resize by --max-side) is decoded, rotated upright, converted to RGB
    (alpha is dropped) and re-encoded at --quality; the manifest counts these per reason.
  * ``raw`` mode stores the same upright RGB pixels, resized as asked.
  * A file that cannot be decoded (truncated, zero bytes, not an image) is rejected with
    the reason; with validation on, JPEG bytes are fully entropy-decoded to prove them.
  * With ``restarts`` (``--restart-markers``), every baseline JPEG record is rewritten
    losslessly (same DCT coefficients, so the same pixels; optimized Huffman tables) with a
    restart marker after every MCU, so the reader can Huffman-decode only the MCUs around
    a crop (reader/_jpeg.c). The rewrite entropy-decodes every coefficient, so it also validates.
    Progressive files are kept as they are.
"""
from __future__ import annotations

import dataclasses
import io
import os
import stat
from dataclasses import dataclass

from dlpack_io.reader.format import KIND_JPEG, KIND_RAW, crc32


class RejectedInput(Exception):
    """An input file that cannot become a record; the message says why."""


@dataclass(frozen=True)
class EncodedRecord:
    """One record ready for a shard writer."""

    payload: bytes
    height: int
    width: int
    kind: int
    reencoded: str | None = None  # why the original bytes were not kept (jpeg mode)
    source_bytes: int = 0         # size of the input file, for MB/s figures
    crc: int = 0                  # CRC-32 of the payload, computed in the worker

    @property
    def is_passthrough(self) -> bool:
        """True when the payload is the input file's bytes, untouched."""
        return self.kind == KIND_JPEG and self.reencoded is None


def _open(data: bytes):
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise RejectedInput("empty file (0 bytes)")
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise RejectedInput("not an image PIL can identify") from None
    return img


def _full_decode(img) -> None:
    """Decode every pixel; raises on truncated or corrupt data."""
    try:
        img.load()
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError...
        raise RejectedInput(f"cannot decode {img.format or 'image'}: {exc}") from None


def _validate_jpeg(img) -> None:
    """Prove a JPEG decodes: every entropy-coded coefficient is read, but the inverse DCT
    runs at 1/8 scale (libjpeg's DCT scaling), 25% faster than a full decode."""
    img.draft("RGB", (1, 1))
    _full_decode(img)


def _orientation(img) -> int:
    try:
        return int(img.getexif().get(0x0112, 1) or 1)
    except Exception:  # malformed EXIF blocks are common; treat as upright
        return 1


def _why_reencode(img, orientation: int) -> str | None:
    if img.format != "JPEG":
        return f"{img.format or 'unknown'} file with a JPEG name"
    if img.mode != "RGB":
        return f"{img.mode} JPEG"
    if orientation != 1:
        return "EXIF-rotated JPEG"
    return None


def _upright_rgb(img, orientation: int):
    from PIL import ImageOps

    _full_decode(img)
    if orientation != 1:
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
    from dlpack_io.reader import _jpeg

    try:
        return _jpeg.add_restarts(data)
    except ValueError as exc:
        raise RejectedInput(f"cannot decode JPEG: {exc}") from None


def encode_file(data: bytes, *, mode: str, size=None, max_side=None, quality=95,
                validate=True, restarts=False) -> EncodedRecord:
    """Encode the bytes of one input file as a record; raise RejectedInput if impossible."""
    img = _open(data)
    orientation = _orientation(img)
    if mode == "jpeg":
        why = _why_reencode(img, orientation)
        if why is None and max_side is not None and max(img.size) > max_side:
            why = "resized (--max-side)"
        if why is None:
            width, height = img.size  # before draft() shrinks it
            if restarts:  # decodes every coefficient: validates too
                rewritten = _add_restarts(data)
                if rewritten is not None:
                    return EncodedRecord(rewritten, height, width, KIND_JPEG, RESTARTS_ADDED)
            elif validate:
                _validate_jpeg(img)
            return EncodedRecord(data, height, width, KIND_JPEG)
        _draft_for(img, size, max_side)
        img = _resize(_upright_rgb(img, orientation), None, max_side)
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=quality)
        payload = out.getvalue()
        if restarts:
            payload = _add_restarts(payload) or payload
        return EncodedRecord(payload, img.size[1], img.size[0], KIND_JPEG, why)
    _draft_for(img, size, max_side)
    img = _resize(_upright_rgb(img, orientation), size, max_side)
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
