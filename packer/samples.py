"""One sample from code (``Writer.write``) made ready for a shard: the image as record
bytes and the fields as a field block, every check done before anything is written."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import os

import numpy as np

from dlpack_io.packer.encode import encode_file
from dlpack_io.packer.records import RejectedInput
from dlpack_io.reader.format import crc32
from dlpack_io.reader.format.fields import check_field_name, encode_fields, spec_of
from dlpack_io.reader.format.regular import read_input


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


def first_schema(fields: dict, where: str) -> dict:
    """The field schema the first sample fixes: name -> spec (arrays keep their shape
    until a later sample differs)."""
    schema = {}
    for name in sorted(fields):
        try:
            check_field_name(name, where)
        except Exception as exc:  # FormatError: say it as the value error it is here
            raise ValueError(str(exc)) from None
        schema[name] = spec_of(fields[name], f"{where} field {name!r}")
    return schema


def note_shapes(schema: dict, fields: dict) -> None:
    """Forget an array field's fixed shape once a sample's differs (it becomes null)."""
    for name, spec in schema.items():
        if spec["type"] == "array" and spec["shape"] is not None \
                and list(np.shape(fields[name])) != spec["shape"]:
            spec["shape"] = None


def encode_sample(image, fields: dict, schema: dict, options) -> tuple:
    """(EncodedRecord with its CRC, field block or None, path) of one sample; ValueError
    naming the sample and the field when anything does not fit."""
    where = options["where"]
    block = encode_fields(fields, schema, where) if schema else None
    data, path = image_bytes(image, where)
    encode = options["encode"]
    if not isinstance(image, (str, os.PathLike, bytes, bytearray, memoryview)) and \
            encode.get("non_jpeg") == "keep":  # pixels from code: raw records, as given
        encode = dict(encode, non_jpeg="raw")
    try:
        record = encode_file(data, **encode)
    except RejectedInput as exc:
        raise ValueError(f"{where}: image {path or '(bytes)'} cannot be packed: {exc}") from None
    record = dataclasses.replace(record, source_bytes=len(data), crc=crc32(record.payload),
                                 source_sha=hashlib.sha256(data).hexdigest())
    return record, block, path
