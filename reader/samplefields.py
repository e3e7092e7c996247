"""A sample's fields (format 3) read from its shard: the record's field block, copied
under the mapped-file guard, its CRC checked when asked, decoded with every length and
shape checked (reader/format/fields.py)."""
from __future__ import annotations

from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.fields import decode_fields
from dlpack_io.reader.nativecopy import guarded_array


def check_names(dataset, names) -> None:
    """KeyError naming the data set unless every one of ``names`` is a field of it."""
    unknown = [n for n in (names or ()) if n not in dataset.fields]
    if unknown:
        raise KeyError(f"{dataset.path}: no field {unknown[0]!r}; the data set has "
                       f"{sorted(dataset.fields) or 'no fields'} besides image and label")


def read_fields(dataset, i: int, names=None) -> dict:
    """name -> value of sample ``i``'s fields (all of the schema, or ``names``)."""
    check_names(dataset, names)
    if not dataset.fields or names == ():
        return {}
    k, j = dataset.locate(i)
    return read_record_fields(dataset, i, k, j, names)


def read_record_fields(dataset, i: int, k: int, j: int, names=None) -> dict:
    """The fields of sample ``i``, record ``j`` of shard ``k`` (located by the caller)."""
    schema = dataset.fields
    shard = dataset.shards[k]
    if not shard.has_fields:
        raise fmt.FormatError(f"{shard.path}: a format-2 shard in a data set whose manifest "
                              f"declares fields {sorted(schema)}: the files are mixed up")
    where = f"{shard.path} record {j} (sample {i})"  # cheap: built for every sample
    try:
        block = guarded_array(shard.fields_block(j))  # no bytes() copy: a mask is large
    except ValueError as exc:  # MappedFileError: the shard changed under the map
        raise fmt.FormatError(f"{where}: {exc}") from None
    if dataset.verify_checksums:
        crc = shard.fields_entry(j)[1]
        if fmt.crc32(block) != crc:
            raise fmt.FormatError(f"{where}: field block checksum mismatch (stored {crc:#010x}, "
                                  f"computed {fmt.crc32(block):#010x}): damaged data")
    entry = shard.index[j]  # the upright size bounds compressed values (masks) before inflating
    return decode_fields(block, schema, where, names, (entry["height"], entry["width"]))
