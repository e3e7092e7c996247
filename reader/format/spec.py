"""The byte layout of a shard: magic, version, header page, index entries, record offsets,
kinds and colours, and the limits every number read from disk is held to; byte counts as
people write them (``parse_size``) and the C extension's one accessor (``native_jpeg``),
which both sides of the format share. Imported through
:mod:`dlpack_io.reader.format`, which documents the whole layout."""
from __future__ import annotations

import os
import re
import struct
import zlib
from dataclasses import dataclass

import numpy as np

# Byte counts written by people: ``256MB``, ``1.5GiB``, ``4096`` (shard sizes, cache limits).
#
# Decimal units (KB, MB, GB, TB) are powers of 1000, binary ones (KiB, MiB...) powers of 1024.
# It lives in the reader because both the packer (--shard-size) and the reader (cache_limit)
# parse sizes, and the reader never imports the packer.

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def parse_size(text) -> int:
    """Parse a byte count such as ``256MB``, ``1.5GiB`` or ``4096`` into an int."""
    if isinstance(text, int):
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"shard size {text!r} is not a size such as 256MB, 1GiB or 4096")
    unit = (match.group(2) or "").upper().rstrip("B")
    return int(float(match.group(1)) * _UNITS[unit])


# The one accessor of the optional C extension ``dlpack_io.reader._jpeg`` (reader/_jpeg.c,
# reader/_huffman.c, reader/_restarts.c, reader/_resize.c: libjpeg-turbo region decoding
# with our Huffman decoder, restart-marker rewriting, the antialiased bilinear resize).
#
# Both sides of the format use it: the reader decodes JPEG records with it
# (reader/jpegdecode.py), and the packer uses it to prove that a JPEG decodes the way the
# reader will decode it and to add restart markers. It lives beside the spec, not in the
# reader's core, because the packer may import only ``dlpack_io.reader.format`` and the storage
# seam; keeping the rule here means ``DLPACK_IO_NO_JPEG_EXT=1`` means the same on both sides.

DISABLE_ENV = "DLPACK_IO_NO_JPEG_EXT"  # "1": behave as if the extension had not built


def native_jpeg():
    """The ``_jpeg`` extension module, or None where it did not build or
    ``DLPACK_IO_NO_JPEG_EXT=1`` (forces the PIL paths: tests, debugging).

    The variable is read on every call, not once at import, so a process (or a test) that
    sets it before packing is honoured; a successful import is cached by Python itself.
    """
    if os.environ.get(DISABLE_ENV) == "1":
        return None
    try:
        from dlpack_io.reader import _jpeg
    except ImportError:  # the optional extension did not build (no libjpeg headers)
        return None
    return _jpeg


MAGIC = b"DLPKSHRD"
FORMAT_VERSION = 3     # 3: records may carry a typed field block after the image (40-byte index)
PLAIN_VERSION = 2      # what a data set without fields is written as: the same bytes as before
READABLE_VERSIONS = (2, 3)
HEADER_SIZE = 4096
RECORD_ALIGN = 64
MANIFEST_NAME = "manifest.json"
REJECTS_NAME = "rejects.tsv"
MANIFEST_KIND = "dlpack-dataset"

FORMATS = ("record", "lmdb")
MODES = ("jpeg", "raw", "planes")
SHARD_SUFFIX = {"record": ".rec", "lmdb": ".lmdb"}
SHARD_NAME_RE = re.compile(r"^shard-\d{5,}\.(rec|lmdb)$")

# Record kinds stored in INDEX_DTYPE["kind"].
KIND_JPEG = 0   # payload is a complete JPEG file (baseline or progressive, any colour)
KIND_RAW = 1    # payload is height*width*channels uint8 pixels, HWC, row-major
KIND_FILE = 2   # payload is a complete PNG or WebP file, kept as it was packed (its lossless
#                 compression kept): decoded with PIL, turned upright by its own EXIF and
#                 converted to RGB (ImageOps.exif_transpose(img).convert("RGB")), exactly
#                 the pixels a raw record of it holds; index orientation 1, colour 0
KIND_PLANES = 3  # payload is a JPEG's decoded Y/Cb/Cr planes as libjpeg leaves them after the
#                 IDCT, before chroma upsampling and colour conversion (PLANES_HEADER, then
#                 the planes); the reader upsamples and converts exactly as libjpeg-turbo
#                 does, so the pixels are the JPEG's; orientation 1..8 as a JPEG record's,
#                 colour COLOUR_YCC (3 planes) or COLOUR_GRAY (1)
KINDS = (KIND_JPEG, KIND_RAW, KIND_FILE, KIND_PLANES)
FILE_FORMATS = {b"\x89PNG\r\n\x1a\n": "PNG", b"RIFF": "WEBP"}  # a KIND_FILE payload starts so

# INDEX_DTYPE["colour"]: how a JPEG record's pixels are stored (all decode to RGB; raw and
# file records: 0).
COLOUR_YCC = 0    # 3 components: YCbCr (or RGB by Adobe marker): decoded as is
COLOUR_GRAY = 1   # 1 component: grey replicated to R = G = B
COLOUR_CMYK = 2   # 4 components (CMYK or YCCK, Adobe-inverted): Pillow's CMYK -> RGB
COLOURS = (COLOUR_YCC, COLOUR_GRAY, COLOUR_CMYK)

# A KIND_PLANES payload: magic, version, components (1 or 3), chroma subsampling h and v
# (1 or 2 each; 1 and 1 for one component), then the stored (not upright) image's height
# and width; then the planes Y, Cb, Cr (chroma ceil(height / v) x ceil(width / h) each).
# Version 1 (PLANES_PLAIN): each plane's samples, rows back to back (planes_payload_size is
# the length). Version 2 (PLANES_PACKED, what the packer writes): each plane cut into 8x8
# blocks in raster order (the edge blocks cut short), then three tables: every block's
# smallest sample (u8), every block's bit width w (u8, 0..8: the fewest bits holding its
# largest sample minus its smallest), and every block's 64 values (sample - smallest; 0
# beyond the plane's edge) row by row, w bits each, LSB first, 8w bytes a block. A sample
# is min(255, smallest + value). reader/_planes.h mirrors this for the C reader.
PLANES_HEADER = struct.Struct("<4sBBBBII")
PLANES_MAGIC = b"DLYP"
PLANES_PLAIN = 1
PLANES_PACKED = 2
PLANES_BLOCK = 8


def planes_payload_size(components: int, h_sub: int, v_sub: int, height: int,
                        width: int) -> int:
    """Bytes of a version-1 (PLANES_PLAIN) KIND_PLANES payload with this header (exact: the
    reader refuses others; a packed payload's length follows from its width table)."""
    chroma = -(-height // v_sub) * -(-width // h_sub) if components == 3 else 0
    return PLANES_HEADER.size + height * width + 2 * chroma


# magic, version, header_size, num_records, data_offset, data_size, index_offset,
# index_size, meta_offset, meta_size, record_align, index_entry_size, index_crc,
# meta_crc, header_crc (CRC of the preceding bytes of this struct).
HEADER_STRUCT = struct.Struct("<8sIIQQQQQQQIIIII")

INDEX_DTYPE = np.dtype([
    ("offset", "<u8"),    # byte offset of the record from the start of the shard file
    ("length", "<u4"),    # payload length in bytes
    ("label", "<i4"),     # class index into manifest["classes"]
    ("crc", "<u4"),       # CRC-32 of the payload
    ("height", "<u4"),    # image height in pixels (after any packing transform)
    ("width", "<u4"),     # image width in pixels
    ("channels", "u1"),   # 3 (every record decodes to RGB)
    ("kind", "u1"),       # KIND_JPEG, KIND_RAW, KIND_FILE or KIND_PLANES
    ("orientation", "u1"),  # EXIF orientation 1..8 the reader applies (1: upright; raw: 1)
    ("colour", "u1"),     # COLOUR_* of a JPEG record's stored pixels (raw: 0)
])
INDEX_ENTRY_SIZE = INDEX_DTYPE.itemsize  # 32
# Version 3: the version-2 entry plus the record's field block, stored right after the
# image payload inside the same aligned record (docs/FORMAT.md, "Fields").
FIELDS_INDEX_DTYPE = np.dtype(INDEX_DTYPE.descr + [
    ("fields_length", "<u4"),  # bytes of the field block after the payload (may be 0)
    ("fields_crc", "<u4"),     # CRC-32 of the field block
])


def index_dtype(version: int) -> np.dtype:
    """The index entry dtype of a shard of format ``version`` (2: 32 bytes, 3: 40 bytes)."""
    return FIELDS_INDEX_DTYPE if version >= 3 else INDEX_DTYPE


def image_index(index: np.ndarray) -> np.ndarray:
    """The version-2 columns of an index table as a packed INDEX_DTYPE array (a copy for
    version 3, the array itself for version 2): what every image path reads."""
    if index.dtype == INDEX_DTYPE:
        return index
    plain = np.empty(len(index), dtype=INDEX_DTYPE)
    for name in INDEX_DTYPE.names:
        plain[name] = index[name]
    return plain

# LMDB shards: one single-file environment per shard; record i under key LMDB_RECORD_KEY(i)
# (8-byte big-endian, so lexicographic key order is index order); index table bytes and
# metadata JSON under fixed keys. LMDB has no header page: the metadata JSON carries
# magic, version, counts and the index CRC instead.
LMDB_INDEX_KEY = b"__index__"
LMDB_META_KEY = b"__meta__"

# Limits a reader applies to data it did not make (docs/FORMAT.md, "Limits"). Every record
# is checked against them when its shard is opened, before anything is sized from it.
MAX_SIDE = 65535                  # largest height or width: the JPEG format's own maximum
DEFAULT_MAX_PIXELS = 89_478_485   # height x width; Pillow's decompression-bomb warning level,
#                                   also the default of `dlpack convert --max-pixels`
MAX_MANIFEST_BYTES = 256 * 2**20  # a manifest is read whole; larger ones are refused
MAX_JSON_INT = 2**63 - 1          # counts, sizes and offsets in JSON must fit in int64
# the most one sample can take in a shard: its image and its field block (u32 lengths each),
# alignment, its index entry and a generous share of metadata (and LMDB's page overhead)
MAX_SAMPLE_SPAN = 2 * (2**32 - 1) + RECORD_ALIGN + 2**20


def max_shard_bytes(num_samples: int) -> int:
    """The largest file a shard of ``num_samples`` records can be (record or LMDB): a
    manifest claiming more is damaged or forged, whatever a server's HEAD says."""
    return HEADER_SIZE + MAX_MANIFEST_BYTES + max(0, int(num_samples)) * MAX_SAMPLE_SPAN


def version_error(where: str, version, readable: tuple = READABLE_VERSIONS) -> str:
    """The message for a data set of another format version: what to do about it
    (``readable``: the versions this dlpack reads for that file: shards, or manifests)."""
    if isinstance(version, int) and version < min(readable):
        return (f"{where}: format version {version}, this dlpack reads versions "
                f"{readable} (version 2 added EXIF orientation and colour to the index); "
                f"re-pack it with this dlpack: dlpack convert SRC DST --overwrite")
    return (f"{where}: format version {version}, this dlpack reads versions {readable}; "
            f"upgrade dlpack (pip install -U dlpack-io) to read it")


class FormatError(Exception):
    """A file of the data set is not what this format version says it must be.

    The message names the file, what was found and what was expected.
    """


def crc32(data, value: int = 0) -> int:
    """CRC-32 (zlib polynomial) of a bytes-like object, as an unsigned int; ``value``: the
    CRC of the bytes before ``data`` (a CRC kept up as pieces arrive). Computed by zlib-ng
    when it is installed (about 3x zlib's speed here: every record a remote epoch reads is
    checked, see docs/benchmarks.md), else by zlib: the same number either way."""
    return (_CRC32 or _load_crc32())(data, value) & 0xFFFFFFFF


_CRC32 = None


def _load_crc32():
    """The fastest CRC-32 at hand (imported on first use: an optional speed-up)."""
    global _CRC32
    try:
        from zlib_ng import zlib_ng
        _CRC32 = zlib_ng.crc32
    except ImportError:
        _CRC32 = zlib.crc32
    return _CRC32


def align_up(value: int, alignment: int = RECORD_ALIGN) -> int:
    """Smallest multiple of ``alignment`` that is >= ``value``."""
    return (value + alignment - 1) // alignment * alignment


def shard_name(shard_number: int, fmt: str) -> str:
    """File name of shard ``shard_number`` for format ``fmt`` (``record`` or ``lmdb``)."""
    return f"shard-{shard_number:05d}{SHARD_SUFFIX[fmt]}"


def lmdb_record_key(index: int) -> bytes:
    """LMDB key of record ``index`` within its shard."""
    return struct.pack(">Q", index)


@dataclass(frozen=True)
class ShardHeader:
    """Parsed header page of a record shard."""

    num_records: int
    data_offset: int
    data_size: int
    index_offset: int
    index_size: int
    meta_offset: int
    meta_size: int
    index_crc: int
    meta_crc: int
    header_crc: int
    version: int = PLAIN_VERSION


def pack_header(num_records, data_size, meta_size, index_crc, meta_crc,
                version: int = PLAIN_VERSION) -> tuple[bytes, ShardHeader]:
    """Build the 4096-byte header page for a shard with the given section sizes.

    Sections follow each other: header, data (``data_size`` bytes, already padded to
    RECORD_ALIGN), index, metadata. ``version`` 3 when the records carry fields.
    """
    data_offset = HEADER_SIZE
    index_offset = data_offset + data_size
    entry_size = index_dtype(version).itemsize
    index_size = num_records * entry_size
    meta_offset = index_offset + index_size
    fields = (MAGIC, version, HEADER_SIZE, num_records, data_offset, data_size,
              index_offset, index_size, meta_offset, meta_size, RECORD_ALIGN,
              entry_size, index_crc, meta_crc)
    body = HEADER_STRUCT.pack(*fields, 0)[:-4]
    header_crc = crc32(body)
    page = (body + struct.pack("<I", header_crc)).ljust(HEADER_SIZE, b"\0")
    header = ShardHeader(num_records, data_offset, data_size, index_offset, index_size,
                         meta_offset, meta_size, index_crc, meta_crc, header_crc, version)
    return page, header


def unpack_header(page, file_size: int, where: str) -> ShardHeader:
    """Parse and validate a header page read from a shard of ``file_size`` bytes.

    Raises FormatError naming ``where`` on a wrong magic, version, checksum or any
    section that does not lie inside the file in the order the spec requires.
    """
    if len(page) < HEADER_SIZE or file_size < HEADER_SIZE:
        raise FormatError(f"{where}: file is {file_size} bytes, shorter than the "
                          f"{HEADER_SIZE}-byte header page; the shard is truncated")
    (magic, version, header_size, n, data_off, data_size, index_off, index_size, meta_off,
     meta_size, align, entry_size, index_crc, meta_crc, header_crc) = HEADER_STRUCT.unpack_from(page)
    if magic != MAGIC:
        raise FormatError(f"{where}: magic is {magic!r}, expected {MAGIC!r}: not a dlpack record shard")
    actual_crc = crc32(bytes(page[:HEADER_STRUCT.size - 4]))
    if actual_crc != header_crc:
        raise FormatError(f"{where}: header checksum mismatch (stored {header_crc:#010x}, "
                          f"computed {actual_crc:#010x}): the header page is damaged")
    if bytes(page[HEADER_STRUCT.size:HEADER_SIZE]).count(0) != HEADER_SIZE - HEADER_STRUCT.size:
        raise FormatError(f"{where}: header padding (bytes {HEADER_STRUCT.size}.."
                          f"{HEADER_SIZE - 1}) is not zero: the header page is damaged")
    if version not in READABLE_VERSIONS:
        raise FormatError(version_error(where, version))
    entry = index_dtype(version).itemsize
    layout = (("header_size", header_size, HEADER_SIZE), ("data_offset", data_off, HEADER_SIZE),
              ("index_offset", index_off, data_off + data_size),
              ("index_size", index_size, n * entry),
              ("meta_offset", meta_off, index_off + index_size), ("record_align", align, RECORD_ALIGN),
              ("index_entry_size", entry_size, entry),
              ("end of the metadata", meta_off + meta_size, file_size))
    for name, found, expected in layout:
        if found != expected:
            raise FormatError(f"{where}: header says {name} = {found}, the layout requires "
                              f"{expected} (file size {file_size}); the shard is truncated or damaged")
    return ShardHeader(n, data_off, data_size, index_off, index_size, meta_off, meta_size,
                       index_crc, meta_crc, header_crc, version)


def index_from_buffer(buffer, num_records: int, where: str,
                      version: int = PLAIN_VERSION) -> np.ndarray:
    """Zero-copy view of an index table (``num_records`` entries of the dtype of format
    ``version``) over ``buffer``."""
    dtype = index_dtype(version)
    if len(buffer) != num_records * dtype.itemsize:
        raise FormatError(f"{where}: index table is {len(buffer)} bytes, expected "
                          f"{num_records} x {dtype.itemsize}")
    return np.frombuffer(buffer, dtype=dtype, count=num_records)


def record_offsets(lengths: np.ndarray, data_offset: int = HEADER_SIZE) -> tuple[np.ndarray, int]:
    """Where the records of a record shard must start, and where its data section ends.

    Records are stored back to back in index order, each padded with zeros to the next
    multiple of RECORD_ALIGN: offset[0] = data_offset, offset[i+1] = align_up(offset[i] +
    length[i]), data end = align_up(end of the last record). Exact for any u32 lengths
    (uint64 arithmetic; a u64 sum of 2^32 entries of < 2^33 bytes cannot wrap).
    """
    padded = (lengths.astype(np.uint64) + np.uint64(RECORD_ALIGN - 1)) // np.uint64(RECORD_ALIGN) \
        * np.uint64(RECORD_ALIGN)
    ends = np.cumsum(padded, dtype=np.uint64) + np.uint64(data_offset)
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = data_offset
        starts[1:] = ends[:-1]
    return starts, int(ends[-1]) if len(ends) else data_offset


def check_index_fields(index: np.ndarray, where: str) -> None:
    """Raise FormatError unless every entry's kind, orientation and colour are known."""
    jpeg = index["kind"] == KIND_JPEG
    planes = index["kind"] == KIND_PLANES
    oriented = jpeg | planes  # the kinds that store the image as shot, turned when read
    bad = np.flatnonzero(~oriented & (index["kind"] != KIND_RAW) & (index["kind"] != KIND_FILE)
                         | (index["orientation"] < 1) | (index["orientation"] > 8)
                         | (~oriented & (index["orientation"] != 1))
                         | (index["colour"] > max(COLOURS)) | (~oriented & (index["colour"] != 0))
                         | (planes & (index["colour"] == COLOUR_CMYK)))
    if bad.size:
        i = int(bad[0])
        raise FormatError(f"{where}: record {i} has kind {int(index['kind'][i])}, orientation "
                          f"{int(index['orientation'][i])}, colour {int(index['colour'][i])}; "
                          f"expected kind 0 (JPEG, orientation 1..8, colour 0..2) or 1 (raw, "
                          f"orientation 1, colour 0) or 2 (PNG/WebP file, orientation 1, "
                          f"colour 0) or 3 (decoded planes, orientation 1..8, colour 0..1)")


MAX_JSON_DEPTH = 32  # our manifests and shard metadata nest 3 deep
_JSON_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # unrolled: fast
_BRACKET_STEP = np.zeros(256, dtype=np.int8)
_BRACKET_STEP[[ord("["), ord("{")]], _BRACKET_STEP[[ord("]"), ord("}")]] = 1, -1


def json_depth(data: bytes) -> int:
    """How deep the brackets of JSON text ``data`` nest, strings left out (no recursion)."""
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # cannot nest deeper than that: the common small case costs nothing
    bare = np.frombuffer(_JSON_STRING_RE.sub(b'""', data), dtype=np.uint8)
    return int(np.cumsum(_BRACKET_STEP[bare], dtype=np.int64).max(initial=0))
