"""Record payload -> HWC uint8 RGB pixels."""
from __future__ import annotations

import io

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.shard import guarded_array


def decode_jpeg(payload, where: str = "record", orientation: int = 1,
                max_pixels: int | None = None) -> np.ndarray:
    """Decode JPEG bytes to an HWC uint8 RGB array (a fresh, writable array) with PIL:
    converted to RGB and turned upright by ``orientation`` (EXIF 1..8) as Pillow's
    ``ImageOps.exif_transpose(img).convert("RGB")`` does; refuse, before decoding, a
    header claiming more than ``max_pixels`` pixels."""
    from PIL import Image

    from dlpack_io.reader.jpegdecode import EXIF_TRANSPOSE

    try:
        img = Image.open(io.BytesIO(payload))
        if max_pixels is not None and img.width * img.height > max_pixels:
            raise ValueError(f"the JPEG header claims {img.width} x {img.height} pixels, more "
                             f"than the {max_pixels} its index entry allows")
        img.load()
    except Exception as exc:
        raise fmt.FormatError(f"{where}: cannot decode JPEG payload ({exc})") from None
    if img.mode != "RGB":
        img = img.convert("RGB")
    if orientation != 1:
        img = img.transpose(getattr(Image.Transpose, EXIF_TRANSPOSE[orientation]))
    return np.asarray(img)


def _decode_jpeg_fast(payload, h: int, w: int, orientation: int, where: str,
                      what: str = "JPEG"):
    """Full decode with the C region decoder (same pixels as PIL), or None without it."""
    from dlpack_io.reader import jpegdecode

    if not jpegdecode.have_extension() or h < 1 or w < 1:
        return None
    out = np.empty((h, w, 3), dtype=np.uint8)
    try:
        region = jpegdecode.decode_region(payload, (0, 0, h, w), 8, out.reshape(-1),
                                          orientation=orientation)
    except ValueError as exc:
        raise fmt.FormatError(f"{where}: cannot decode {what} payload ({exc})") from None
    if region.pixels.shape[:2] != (h, w):
        raise fmt.FormatError(f"{where}: decoded to {region.pixels.shape}, the index says "
                              f"{(h, w, 3)}")
    return out


def decode_planes(payload, h: int, w: int, orientation: int, where: str = "record") -> np.ndarray:
    """Pixels of a KIND_PLANES record (a JPEG's decoded Y/Cb/Cr planes): upsampled and
    converted as libjpeg-turbo does, turned upright by ``orientation``, so exactly the
    pixels of the JPEG it was made from. Needs the C extension (the packer writes planes
    records only with it). A fresh HWC uint8 array of the index's ``h`` x ``w``."""
    if not 1 <= orientation <= 8:
        raise fmt.FormatError(f"{where}: EXIF orientation {orientation}, expected 1..8")
    fast = _decode_jpeg_fast(payload, h, w, orientation, where, "planes")
    if fast is None:
        raise fmt.FormatError(f"{where}: a decoded-planes record needs the C extension "
                              f"dlpack_io.reader._jpeg, which is not built here (install the "
                              f"libjpeg headers and reinstall dlpack-io)")
    return fast


def decode_file(payload, h: int, w: int, where: str = "record") -> np.ndarray:
    """Pixels of a KIND_FILE record (a PNG or WebP file kept as it was packed): decoded with
    PIL, turned upright by its own EXIF, converted to RGB, as the packer's raw records of the
    same input hold them; a header claiming more than the index's ``h`` x ``w`` pixels is
    refused before anything is decoded. A fresh HWC uint8 array."""
    from PIL import Image, ImageOps

    data = guarded_array(payload).tobytes()  # a mapped shard: copied under the SIGBUS guard
    kind = next((name for magic, name in fmt.FILE_FORMATS.items() if data.startswith(magic)),
                None)
    if kind is None:
        raise fmt.FormatError(f"{where}: a file record that is neither PNG nor WebP "
                              f"(starts {data[:8]!r}); damaged: run 'dlpack verify'")
    try:
        img = Image.open(io.BytesIO(data))
        if img.format != kind or img.width * img.height > h * w:
            raise ValueError(f"a {img.format} header of {img.width} x {img.height} pixels, "
                             f"the index says a {kind} of {w} x {h}")
        img.load()
        img = ImageOps.exif_transpose(img)
        pixels = np.asarray(img if img.mode == "RGB" else img.convert("RGB"))
    except Exception as exc:  # PIL raises many types on damaged data
        raise fmt.FormatError(f"{where}: cannot decode {kind} payload ({exc})") from None
    if pixels.shape != (h, w, 3):
        raise fmt.FormatError(f"{where}: decoded to {pixels.shape}, the index says {(h, w, 3)}")
    return pixels


def decode_record(payload, entry, where: str = "record") -> np.ndarray:
    """Pixels of one record given its index ``entry`` (a row of INDEX_DTYPE): upright RGB,
    the EXIF orientation and colour conversion applied as the index says."""
    h, w, c = int(entry["height"]), int(entry["width"]), int(entry["channels"])
    if entry["kind"] == fmt.KIND_RAW:  # copied under the SIGBUS guard (a mapped shard)
        return guarded_array(payload).reshape(h, w, c)
    if entry["kind"] == fmt.KIND_FILE:
        return decode_file(payload, h, w, where)
    if entry["kind"] == fmt.KIND_PLANES:
        return decode_planes(payload, h, w, int(entry["orientation"]), where)
    if entry["kind"] != fmt.KIND_JPEG:
        raise fmt.FormatError(f"{where}: unknown record kind {int(entry['kind'])}")
    orientation = int(entry["orientation"])
    if not 1 <= orientation <= 8:
        raise fmt.FormatError(f"{where}: EXIF orientation {orientation}, expected 1..8")
    if c == 3:
        fast = _decode_jpeg_fast(payload, h, w, orientation, where)
        if fast is not None:
            return fast
    pixels = decode_jpeg(payload, where, orientation, max_pixels=h * w)  # no more than indexed
    if pixels.shape != (h, w, c):
        raise fmt.FormatError(f"{where}: decoded to {pixels.shape}, the index says {(h, w, c)}")
    return pixels
