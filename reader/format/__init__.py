"""THE on-disk specification of a dlpack data set.

Every byte layout, offset formula, version literal and key scheme lives here and nowhere
else: the packer writes through these functions and the reader parses through them
(house rule 1). ``docs/FORMAT.md`` describes the same layout for readers in other languages.

A data set is a directory holding
  * ``manifest.json``           written last, atomically: no manifest, no data set;
  * ``shard-NNNNN.rec``         record shards (``format="record"``), or
  * ``shard-NNNNN.lmdb``        LMDB shards (``format="lmdb"``, single-file environments);
  * ``rejects.tsv``             inputs that were skipped, with the reason.

Record shard layout (all integers little-endian)::

    [0, 4096)                 header page (HEADER_STRUCT, zero padded)
    [data_offset, +data_size) records, each starting at a multiple of RECORD_ALIGN
    [index_offset, +N*32)     index table, N entries of INDEX_DTYPE
    [meta_offset, +meta_size) shard metadata, UTF-8 JSON

Checksums are CRC-32 (zlib polynomial). The header carries CRCs of the index and of the
metadata and a CRC of itself; each index entry carries the CRC of its record; the manifest
carries each shard's header CRC and a CRC of its own canonical JSON. One chain of checksums
therefore covers every byte that has meaning.

The spec is cut in three modules, re-exported here, so that readers and writers say
``from dlpack_io.reader import format as fmt`` and use ``fmt.NAME``: ``spec`` (the shard
bytes, the limits, sizes written by people), ``schema`` (metadata and manifest JSON) and
``fields`` (the field schema and a record's field block). Beside them, ``checks``: every
number of an index or an LMDB file checked before it is used, regular files only.
"""
from dlpack_io.reader.format.fields import (ARRAY_DTYPES, FIELD_TYPES, RESERVED_NAMES,
                                            check_field_name, check_field_schema)
from dlpack_io.reader.format.schema import (HISTORY_KEY, MANIFEST_FIELDS, MAX_JSON_DEPTH,
                                            RETIRED_KEY, RETIRING_VERSION, SHARD_ENTRY_FIELDS,
                                            SOURCES_KEY, VOLATILE_MANIFEST_KEYS, accounting_problem,
                                            check_history, check_retired, check_shard_name,
                                            decode_json, encode_meta, json_depth, lmdb_meta,
                                            manifest_checksum, retired_pairs, retired_records,
                                            sample_records, sources_of, validate_manifest)
from dlpack_io.reader.format.spec import (COLOUR_CMYK, COLOUR_GRAY, COLOUR_YCC, COLOURS,
                                          DEFAULT_MAX_PIXELS, FIELDS_INDEX_DTYPE, FILE_FORMATS,
                                          FORMAT_VERSION, FORMATS, HEADER_SIZE, HEADER_STRUCT,
                                          INDEX_DTYPE, INDEX_ENTRY_SIZE, KIND_FILE, KIND_JPEG,
                                          KIND_PLANES, KIND_RAW, KINDS, LMDB_INDEX_KEY, LMDB_META_KEY, MAGIC,
                                          MANIFEST_KIND, MANIFEST_NAME, MAX_JSON_INT,
                                          MAX_MANIFEST_BYTES, MAX_SIDE, MODES, PLAIN_VERSION,
                                          PLANES_BLOCK, PLANES_HEADER, PLANES_MAGIC,
                                          PLANES_PACKED, PLANES_PLAIN,
                                          READABLE_VERSIONS, RECORD_ALIGN, REJECTS_NAME,
                                          SHARD_NAME_RE, SHARD_SUFFIX, FormatError, ShardHeader,
                                          align_up, check_index_fields, crc32, image_index,
                                          index_dtype, index_from_buffer, lmdb_record_key,
                                          max_shard_bytes, pack_header, planes_payload_size,
                                          record_offsets, shard_name,
                                          unpack_header, version_error)
