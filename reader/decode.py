"""Record payload -> HWC uint8 RGB pixels."""
from __future__ import annotations

import io

import numpy as np

from dlpack_io.reader import format as fmt


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


def decode_record(payload, entry, where: str = "record") -> np.ndarray:
    """Pixels of one record given its index ``entry`` (a row of INDEX_DTYPE)."""
    h, w, c = int(entry["height"]), int(entry["width"]), int(entry["channels"])
    if entry["kind"] == fmt.KIND_RAW:
        return np.frombuffer(payload, dtype=np.uint8).reshape(h, w, c).copy()
    if entry["kind"] != fmt.KIND_JPEG:
        raise fmt.FormatError(f"{where}: unknown record kind {int(entry['kind'])}")
    pixels = decode_jpeg(payload, where)
    if pixels.shape != (h, w, c):
        raise fmt.FormatError(f"{where}: decoded to {pixels.shape}, the index says {(h, w, c)}")
    return pixels
