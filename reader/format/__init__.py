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

The spec is cut in two modules, both re-exported here, so that readers and writers say
``from dlpack_io.reader import format as fmt`` and use ``fmt.NAME``: ``spec`` (the shard
bytes) and ``schema`` (metadata and manifest JSON). Beside them: ``units`` (sizes written
by people), ``indexcheck`` and ``lmdbcheck`` (every number of an index or an LMDB file
checked before it is used).
"""
from dlpack_io.reader.format.schema import (encode_meta, MAX_JSON_DEPTH, json_depth, decode_json,
                                            check_shard_name, manifest_checksum, lmdb_meta,
                                            MANIFEST_FIELDS, SHARD_ENTRY_FIELDS,
                                            VOLATILE_MANIFEST_KEYS, validate_manifest,
                                            accounting_problem)
from dlpack_io.reader.format.history import (SOURCES_KEY, HISTORY_KEY, check_history,
                                             sources_of)
from dlpack_io.reader.format.retired import (RETIRED_KEY, RETIRING_VERSION, check_retired,
                                             retired_pairs, sample_records, retired_records)
from dlpack_io.reader.format.fieldschema import (FIELD_TYPES, ARRAY_DTYPES, RESERVED_NAMES,
                                                 check_field_name, check_field_schema)
from dlpack_io.reader.format.spec import (PLAIN_VERSION, READABLE_VERSIONS, FIELDS_INDEX_DTYPE,
                                          index_dtype, image_index)
from dlpack_io.reader.format.spec import (MAGIC, FORMAT_VERSION, HEADER_SIZE, RECORD_ALIGN,
                                          MANIFEST_NAME, REJECTS_NAME, MANIFEST_KIND, FORMATS,
                                          MODES, SHARD_SUFFIX, SHARD_NAME_RE, KIND_JPEG, KIND_RAW,
                                          KIND_FILE, KINDS, FILE_FORMATS,
                                          COLOUR_YCC, COLOUR_GRAY, COLOUR_CMYK, COLOURS,
                                          HEADER_STRUCT, INDEX_DTYPE, INDEX_ENTRY_SIZE,
                                          LMDB_INDEX_KEY, LMDB_META_KEY, MAX_SIDE,
                                          DEFAULT_MAX_PIXELS, MAX_MANIFEST_BYTES, MAX_JSON_INT,
                                          version_error, FormatError, crc32, align_up, shard_name,
                                          lmdb_record_key, ShardHeader, pack_header,
                                          unpack_header, index_from_buffer, record_offsets,
                                          check_index_fields, max_shard_bytes)
