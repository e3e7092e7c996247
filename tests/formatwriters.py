"""Small writers of other projects' file formats for the tests, byte for byte as their
specifications publish them: TFRecord (tf.train.Example in protobuf wire format, masked
CRC-32C), MXNet RecordIO (magic, flag << 29 | length, 4-byte padding, IRHeader), WebDataset
tars (tarfile), and photo-like JPEGs to put in them."""
from __future__ import annotations

import io
import struct
import tarfile

import crc32c

RECORDIO_MAGIC = 0xCED7230A


def masked_crc(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def _ld(num: int, data: bytes) -> bytes:  # a length-delimited protobuf field
    return varint(num << 3 | 2) + varint(len(data)) + data


def _feature(value) -> bytes:
    values = value if isinstance(value, list) else [value]
    if values and isinstance(values[0], bytes):
        return _ld(1, b"".join(_ld(1, v) for v in values))
    if values and isinstance(values[0], float):
        return _ld(2, _ld(1, struct.pack(f"<{len(values)}f", *values)))
    return _ld(3, _ld(1, b"".join(varint(v & (2**64 - 1)) for v in values)))


def example(features: dict) -> bytes:
    """A serialized tf.train.Example of {name: bytes | [bytes] | int | [int] | float | [float]}."""
    return _ld(1, b"".join(_ld(1, _ld(1, k.encode()) + _ld(2, _feature(v)))
                           for k, v in features.items()))


def tfrecord(records) -> bytes:
    out = b""
    for data in records:
        length = struct.pack("<Q", len(data))
        out += length + struct.pack("<I", masked_crc(length)) + data + \
            struct.pack("<I", masked_crc(data))
    return out


def irheader(label: float, ident: int, image: bytes, labels=None) -> bytes:
    flag = len(labels) if labels else 0
    return struct.pack("<IfQQ", flag, label, ident, 0) + \
        (struct.pack(f"<{flag}f", *labels) if flag else b"") + image


def recordio(payloads) -> tuple[bytes, str]:
    """(.rec bytes, .idx text); a payload holding the magic word at an aligned position is
    split there into parts (flags 1, 2, 3) as dmlc-core's writer does."""
    out, idx, magic = b"", "", struct.pack("<I", RECORDIO_MAGIC)
    for k, data in enumerate(payloads):
        idx += f"{k}\t{len(out)}\n"
        parts, start = [], 0
        for i in range(0, len(data) - 3, 4):
            if data[i:i + 4] == magic:
                parts.append(data[start:i])
                start = i + 4
        parts.append(data[start:])
        for j, part in enumerate(parts):
            flag = 0 if len(parts) == 1 else 1 if j == 0 else 3 if j == len(parts) - 1 else 2
            out += struct.pack("<II", RECORDIO_MAGIC, flag << 29 | len(part)) + part + \
                b"\0" * (-len(part) % 4)
    return out, idx


def add_member(tar: tarfile.TarFile, name: str, data: bytes = b"", kind=tarfile.REGTYPE,
               link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.linkname = (len(data) if kind == tarfile.REGTYPE else 0), kind, link
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def photos(root, count: int, classes: int = 3, seed: int = 0) -> list:
    """``count`` small photo-like JPEGs (bytes) made under ``root``."""
    from dlpack_io.tools.synth import make_image_folder

    return [p.read_bytes() for p in make_image_folder(root, count, classes, seed=seed,
                                                      size=(32, 40))]
