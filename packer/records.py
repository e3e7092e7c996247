"""What one input becomes on its way into a shard: an ``EncodedRecord``, or a
``RejectedInput`` saying why it cannot be packed.

Apart from encode.py because the shard writers, the Ray tasks and the PIL steps
(pilimage.py) all speak these two types, and none of them needs the encoding rule itself.
"""
from __future__ import annotations

from dataclasses import dataclass

from dlpack_io.reader.format import COLOUR_YCC, KIND_JPEG


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
    source_sha: str = ""          # SHA-256 (hex) of the input file: what an append compares

    @property
    def is_passthrough(self) -> bool:
        """True when the payload is the input file's bytes, untouched."""
        return self.kind == KIND_JPEG and self.reencoded is None and self.lossless is None

# The size of an encode item that is a reject before it is read (its mtime slot then holds
# the reason): a list row with a NUL in its path, a label that is not a class number.
BAD_INPUT = -2
