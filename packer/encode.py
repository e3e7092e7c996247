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
  * ``planes`` mode stores each JPEG's decoded Y/Cb/Cr planes as libjpeg leaves them after
    the IDCT (KIND_PLANES, packed losslessly in 8x8 blocks: version 2): the reader skips
    Huffman decoding and the IDCT and upsamples and converts exactly as libjpeg-turbo
    does, so a record decodes to the JPEG's own pixels
    (proven here per image: both decodes are compared, and a JPEG whose planes would not
    give its pixels, CMYK/YCCK, Adobe RGB or unusual chroma sampling among them, is stored
    as ``jpeg`` mode would store it); counted under ``lossless``. A JPEG over --max-side
    and every other image format are stored as ``raw`` mode stores them.
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
import threading
import warnings

import numpy as np

from dlpack_io.packer.options import PackOptions
from dlpack_io.packer.records import BAD_INPUT, EncodedRecord, RejectedInput
from dlpack_io.reader.format import (COLOUR_CMYK, COLOUR_GRAY, COLOUR_YCC, KIND_FILE, KIND_JPEG,
                                     KIND_PLANES, KIND_RAW, crc32)
from dlpack_io.reader.format.checks import open_input, read_input
from dlpack_io.reader.format.spec import native_jpeg

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


PLANES_KEPT = "decoded planes (the JPEG's own pixels)"


def _planes_record(data: bytes, img, max_pixels: int):
    """The KIND_PLANES record of a JPEG, or None when its planes would not decode to its
    own pixels (the caller stores it as jpeg mode does). Decodes the JPEG twice, as libjpeg
    and from its planes, and compares every pixel: packing pays so reading never differs."""
    jpeg = native_jpeg()
    width, height = img.size
    try:
        planes = jpeg.to_planes(data, max_pixels)
        if planes is None:
            return None
        want, got = (np.empty(height * width * 3, dtype=np.uint8) for _ in range(2))
        jpeg.decode_region(data, want, 0, 0, height, width, 8, 3, 1)
        jpeg.decode_region(planes, got, 0, 0, height, width, 8, 3, 1)
    except ValueError:  # the jpeg-mode path names what is wrong with it
        return None
    if not np.array_equal(want, got):
        return None
    orientation = exif_orientation(img)
    upright = (height, width) if orientation < 5 else (width, height)
    return EncodedRecord(planes, upright[0], upright[1], KIND_PLANES, lossless=PLANES_KEPT,
                         orientation=orientation, colour=_COLOURS[img.mode])


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
    if mode in ("raw", "planes"):  # planes mode keeps other formats decoded too
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
    oversize = max_side is not None and max(img.size) > max_side
    if mode == "planes" and not oversize:
        record = _planes_record(data, img, max_pixels) if img.mode in _COLOURS else None
        if record is not None:
            return record
        mode = "jpeg"  # CMYK, Adobe RGB, unusual sampling: stored as jpeg mode stores them
    if mode == "jpeg":
        if oversize:
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
    why = "resized (--max-side), stored as raw pixels" if mode == "planes" else None
    return EncodedRecord(img.tobytes(), img.size[1], img.size[0], KIND_RAW, why)


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



# ---- PIL's steps -----------------------------------------------------------------------------
# The PIL steps of encoding one input: open it behind the decompression-bomb guard,
# decode it, turn it upright, convert it to RGB, resize it.
#
# The functions above decide *which* of these steps a record needs (the "same upright RGB
# pixels" rule); here is only *how* each step is done with PIL. PIL is
# imported inside the functions: the packer's parent process and ``dlpack --help`` must not
# pay for it, and a missing PIL is reported by ``require_pil`` with the one-line fix.
PIL_MISSING = ("no PIL provider is installed (dlpack needs one to read images): "
               "pip install 'dlpack-io[pillow]', or pillow-simd for faster resizing")


def require_pil() -> None:
    """Raise RuntimeError with the one-line fix when no PIL provider can be imported.

    Called before any work starts (``convert`` checks before scanning the folder)."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise RuntimeError(PIL_MISSING) from None


# PIL's bomb limit and the warning filters are process globals: threads opening images
# at once (the field blocks made ahead, fields.py) must not interleave their save and
# restore, which left PIL's guard off (None) for the rest of the process
_GLOBALS = threading.Lock()


def _new_lock() -> None:
    """A forked worker starts with a free lock (a thread of the parent may hold it)."""
    global _GLOBALS
    _GLOBALS = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock)


def open_image(data: bytes, max_pixels: int):
    """PIL image of ``data`` (header only), rejected beyond ``max_pixels``."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise RejectedInput("empty file (0 bytes)")
    try:
        with _GLOBALS, warnings.catch_warnings():  # our limit below replaces Pillow's
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


def full_decode(img) -> None:
    """Decode every pixel; raises RejectedInput on truncated or corrupt data."""
    try:
        img.load()
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError...
        raise RejectedInput(f"cannot decode {img.format or 'image'}: {exc}") from None


def exif_orientation(img) -> int:
    """The EXIF orientation (1..8) the reader must apply; 1 when absent or malformed."""
    try:
        value = int(img.getexif().get(0x0112, 1) or 1)
    except Exception:  # malformed EXIF blocks are common; Pillow then leaves it as it is
        return 1
    return value if 1 <= value <= 8 else 1  # exif_transpose ignores other values too


def upright_rgb(img):
    """Fully decoded, EXIF-transposed RGB image: the pixels every record must decode to."""
    from PIL import ImageOps

    full_decode(img)
    img = ImageOps.exif_transpose(img)
    if img.mode != "RGB":
        img = img.convert("RGB")
    return img


def target_size(w: int, h: int, size: int | None, max_side: int | None) -> tuple[int, int]:
    """Size to resize to before any center crop: shorter side = size, or longer <= max_side."""
    if size is not None:
        scale = size / min(w, h)
    elif max_side is not None and max(w, h) > max_side:
        scale = max_side / max(w, h)
    else:
        return w, h
    return max(1, round(w * scale)), max(1, round(h * scale))


def resize(img, size: int | None, max_side: int | None):
    """Resize as asked (bilinear), then center-crop to ``size`` x ``size`` when ``size``."""
    from PIL import Image

    w, h = img.size
    tw, th = target_size(w, h, size, max_side)
    if (tw, th) != (w, h):
        img = img.resize((tw, th), Image.BILINEAR)
    if size is not None:
        left, top = (tw - size) // 2, (th - size) // 2
        img = img.crop((left, top, left + size, top + size))
    return img


def draft_for(img, size, max_side) -> None:
    """Let libjpeg decode at 1/2, 1/4 or 1/8 scale when the target is that much smaller."""
    if img.format == "JPEG" and (size or max_side):
        tw, th = target_size(*img.size, size, max_side)
        img.draft("RGB", (tw, th))


def image_bytes(image, where: str) -> tuple[bytes, str]:
    """(file bytes, name for the shard metadata) of a path, encoded bytes, PIL image or
    HWC uint8 array (pixels become a lossless PNG that the encoding rule then stores)."""
    if isinstance(image, (str, os.PathLike)):
        return read_input(image), os.fspath(image)  # a FIFO or device: OSError naming it
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image), ""
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or \
                (image.ndim == 3 and image.shape[2] not in (1, 3)):
            raise ValueError(f"{where}: image array {image.dtype} {image.shape}: expected "
                             f"uint8 HxWx3 (RGB), HxWx1 or HxW (grey)")
        from PIL import Image

        image = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[2] == 1
                                else image)
    if hasattr(image, "save") and hasattr(image, "mode"):  # a PIL image
        out = io.BytesIO()
        image.save(out, format="PNG", compress_level=1)
        return out.getvalue(), ""
    raise ValueError(f"{where}: image is a {type(image).__name__}; expected a path, JPEG "
                     f"(or PNG, ...) bytes, a PIL image or an HxWx3 uint8 array")
