"""Array field values stored compressed: the ``"codec"`` of an array spec (issue 25).

Layout of such a value (docs/FORMAT.md, "Fields"): the ``ndim`` u32 dimensions as for
any array, then one zlib stream of the ``prod(shape)`` little-endian elements in C order.
zlib was chosen by measuring segmentation masks (benchmarks/mask_codec.py,
docs/detection.md): 65x smaller than raw at level 1, decoded faster than PNG, and in the
standard library. Level 1 because the packer compresses every mask: level 6 is ~2x
smaller still (1.5 vs 2.9 KB for a 500 x 375 mask, next to a ~60 KB JPEG) but 2.5x
slower to encode, and no faster to decode. The decoder reads any level. Decoding trusts nothing: the decoded size is computed from the shape
(Python ints, no overflow), bounded by MAX_DECODED_BYTES before any allocation, and the
stream is inflated with ``max_length`` so a decompression bomb stops at that size; a
stream that decodes to any other size, or has bytes after its end, is damaged.
When the caller knows the record's upright image size (its index entry), ``check_shape``
bounds the shape by it before anything is inflated: the image's segmentation mask must be
exactly (height, width), any other compressed value at most VALUES_PER_PIXEL elements per
pixel; so a hostile shard cannot make a small image's value inflate to 2 GiB.
"""
from __future__ import annotations

import math
import zlib

from dlpack_io.reader.format.spec import FormatError

ZLIB_LEVEL = 1
MAX_DECODED_BYTES = 2**31  # one field value: 2 GiB (a 32768 x 32768 uint16 mask is 2 GiB)
# the packer compresses only masks (one element per pixel); 4 leaves room for a few
# planes per pixel while keeping a value within 4 x the image's own pixel count
VALUES_PER_PIXEL = 4
MASK_FIELD, MASK_DTYPES = "mask", ("uint8", "uint16")


def is_image_mask(name: str, spec: dict) -> bool:
    """True when field ``name`` is the image's segmentation mask as the packer writes it
    (packer/targets.py ``mask_spec``): a compressed 2-D uint8/uint16 ``"mask"``."""
    return name == MASK_FIELD and bool(spec.get("codec")) and spec.get("ndim") == 2 \
        and spec.get("dtype") in MASK_DTYPES


def check_shape(shape: tuple, name: str, spec: dict, image_size, where: str) -> None:
    """FormatError naming ``where`` unless the declared ``shape`` of compressed field
    ``name`` fits the record's upright ``image_size`` (height, width); checked before
    inflating. No check without an image size (a value decoded on its own)."""
    if image_size is None:
        return
    height, width = (int(v) for v in image_size)
    if is_image_mask(name, spec):
        if tuple(shape) != (height, width):
            raise FormatError(f"{where}: mask shape {tuple(shape)}, the record's image is "
                              f"{height}x{width}: a mask must be its image's size; the "
                              f"record is damaged or hostile, repack it")
        return
    count, budget = math.prod(shape), VALUES_PER_PIXEL * height * width
    if count > budget:
        raise FormatError(f"{where}: compressed array of shape {tuple(shape)} ({count} "
                          f"elements) for a {height}x{width} image, at most {budget} "
                          f"({VALUES_PER_PIXEL} per pixel): the record is damaged or hostile")


def compress(data: bytes, codec: str) -> bytes:
    """The stored bytes of an array's elements ``data`` under ``codec``."""
    if codec != "zlib":
        raise ValueError(f"codec {codec!r}: expected 'zlib'")
    return zlib.compress(data, ZLIB_LEVEL)


def decompress(stream, codec: str, expected: int, where: str) -> bytes:
    """The ``expected`` bytes of elements that ``stream`` holds; FormatError naming
    ``where`` when the stream is damaged, too large or decodes to another size."""
    if codec != "zlib":
        raise FormatError(f"{where}: codec {codec!r:.40}, this reader knows 'zlib'")
    if expected > MAX_DECODED_BYTES:
        raise FormatError(f"{where}: the shape asks for {expected} decoded bytes, more than "
                          f"{MAX_DECODED_BYTES} per value: the record is damaged or hostile")
    inflater = zlib.decompressobj()
    try:
        # stops at expected bytes; max_length 0 would mean "no limit", so an empty shape
        # (an image without objects) asks for 1 byte: any byte at all is then refused
        out = inflater.decompress(bytes(stream), max(expected, 1))
    except zlib.error as exc:
        raise FormatError(f"{where}: compressed array does not inflate ({exc})") from None
    if len(out) != expected or not inflater.eof or inflater.unconsumed_tail \
            or inflater.unused_data:
        raise FormatError(f"{where}: compressed array decodes to "
                          f"{'more than ' if inflater.unconsumed_tail else ''}{len(out)} "
                          f"bytes{'' if inflater.eof else ' (stream cut short)'}, its shape "
                          f"needs exactly {expected}: the record is damaged")
    return out
