"""What a shard knows about its records' field blocks (format 3), apart from shard.py so
that the image path stays as it was: the image columns of the index are kept as the
32-byte INDEX_DTYPE every reader of images uses, the field columns beside them."""
from __future__ import annotations

import numpy as np

from dlpack_io.reader import format as fmt


class FieldColumns:
    """Mixin of the shard classes: ``fields_entry(i)`` and how an index is kept."""

    _fields = None  # format 3: (fields_length, fields_crc) per record; format 2: None

    def fields_entry(self, i: int) -> tuple[int, int]:
        """(length, CRC-32) of record ``i``'s field block; (0, 0) in a format-2 shard."""
        self._ensure_open()
        if self._fields is None:
            return 0, 0
        return int(self._fields["fields_length"][i]), int(self._fields["fields_crc"][i])

    @property
    def has_fields(self) -> bool:
        """True for a format-3 shard (its records carry a field block, maybe empty)."""
        self._ensure_open()
        return self._fields is not None

    def _keep_index(self, index: np.ndarray) -> None:
        """Keep the image columns (what every image path reads) and, for format 3, the
        field columns beside them (checked with the rest of the index at open)."""
        self._index = fmt.image_index(index)
        self._fields = None if index.dtype == fmt.INDEX_DTYPE else \
            np.ascontiguousarray(index[["fields_length", "fields_crc"]])

    def fields_block(self, i: int) -> memoryview:
        """Zero-copy bytes of record ``i``'s field block (empty in a format-2 shard): in a
        record shard they follow the image payload in the mapped file."""
        length, _ = self.fields_entry(i)
        start = int(self._index["offset"][i]) + int(self._index["length"][i])
        return self.span(start, start + length)
