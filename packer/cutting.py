"""THE rule that decides where one shard ends and the next begins, for every engine.

Shards are cut by encoded size in packing order: a record starts a new shard when the
current shard already holds a record and adding this one would pass ``shard_size`` bytes
of record data. The local engine applies it while writing; the Ray engine applies it to
the sizes its encode tasks report, before any shard is written. Both call this class, so
both cut at the same records and produce the same bytes.
"""
from __future__ import annotations

from dlpack_io.reader import format as fmt


def footprint(data_format: str, payload_len: int) -> int:
    """Bytes one record adds to a shard's record data: record shards align each record
    (the writer pads it), LMDB shards store it as it is."""
    return fmt.align_up(payload_len) if data_format == "record" else payload_len


class ShardCutter:
    """Feed it every packed record's payload length, in packing order."""

    def __init__(self, data_format: str, shard_size: int):
        self.data_format = data_format
        self.shard_size = shard_size
        self.records = 0    # records in the current shard
        self.data_size = 0  # their footprint

    def starts_new_shard(self, payload_len: int) -> bool:
        """Account one record; True when the shard before it is full, so the record is
        the first of a new shard (the caller finishes the current shard first)."""
        new = self.records > 0 and self.data_size + payload_len > self.shard_size
        if new:
            self.records, self.data_size = 0, 0
        self.records += 1
        self.data_size += footprint(self.data_format, payload_len)
        return new
