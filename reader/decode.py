"""Record payload -> HWC uint8 RGB pixels."""
from __future__ import annotations

import io

import numpy as np

from dlpack_io.reader import format as fmt

PIL_MISSING = ("no PIL provider is installed (dlpack needs one to read images): "
               "pip install 'dlpack-io[pillow]', or pillow-simd for faster resizing")


def require_pil() -> None:
    """Raise RuntimeError with the one-line fix when no PIL provider can be imported.

    Called before any work starts (``convert`` checks before scanning the folder)."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise RuntimeError(PIL_MISSING) from None


def decode_jpeg(payload, where: str = "record") -> np.ndarray:
    """Decode JPEG bytes to an HWC uint8 RGB array (a fresh, writable array)."""
    from PIL import Image

    try:
        img = Image.open(io.BytesIO(payload))
        img.load()
    except Exception as exc:
        raise fmt.FormatError(f"{where}: cannot decode JPEG payload ({exc})") from None
    if img.mode != "RGB":
        img = img.convert("RGB")
    return np.asarray(img)


def _decode_jpeg_fast(payload, h: int, w: int, where: str):
    """Full decode with the C region decoder (same pixels as PIL), or None without it."""
    from dlpack_io.reader import jpegdecode

    if not jpegdecode.have_extension() or h < 1 or w < 1:
        return None
    out = np.empty((h, w, 3), dtype=np.uint8)
    try:
        region = jpegdecode.decode_region(payload, (0, 0, h, w), 8, out.reshape(-1))
    except ValueError as exc:
        raise fmt.FormatError(f"{where}: cannot decode JPEG payload ({exc})") from None
    if region.pixels.shape[:2] != (h, w):
        raise fmt.FormatError(f"{where}: decoded to {region.pixels.shape}, the index says "
                              f"{(h, w, 3)}")
    return out


def decode_record(payload, entry, where: str = "record") -> np.ndarray:
    """Pixels of one record given its index ``entry`` (a row of INDEX_DTYPE)."""
    h, w, c = int(entry["height"]), int(entry["width"]), int(entry["channels"])
    if entry["kind"] == fmt.KIND_RAW:
        return np.frombuffer(payload, dtype=np.uint8).reshape(h, w, c).copy()
    if entry["kind"] != fmt.KIND_JPEG:
        raise fmt.FormatError(f"{where}: unknown record kind {int(entry['kind'])}")
    if c == 3:
        fast = _decode_jpeg_fast(payload, h, w, where)
        if fast is not None:
            return fast
    pixels = decode_jpeg(payload, where)
    if pixels.shape != (h, w, c):
        raise fmt.FormatError(f"{where}: decoded to {pixels.shape}, the index says {(h, w, c)}")
    return pixels
