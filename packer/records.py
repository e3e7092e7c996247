"""What one input becomes on its way into a shard: an ``EncodedRecord``, or a
``RejectedInput`` saying why it cannot be packed; and where the bytes of an input that lives
inside another file lie (``Members``: a span of a tar, a TFRecord, ...; the ``Spool`` for
bytes that cannot be read where they are: remote objects, gzip'd files, Parquet pages).

Apart from encode.py because the shard writers, the Ray tasks and the PIL steps
(encode.py) all speak these two types, and none of them needs the encoding rule itself.
"""
from __future__ import annotations

import logging
import os
import re
import tempfile
import weakref
import zlib
from dataclasses import dataclass, field

from dlpack_io.reader.format import COLOUR_YCC, KIND_JPEG

log = logging.getLogger(__name__)
DOWNLOAD_CHUNK = 32 * 2**20  # one ranged GET of a remote object
MAX_INFLATE, INFLATE_SLACK = 100, 64 * 2**20  # a gzip'd input inflates to at most 100x + 64 MiB


class RejectedInput(Exception):
    """An input file that cannot become a record; the message says why."""


class ConversionError(Exception):
    """A conversion cannot go on; the message names the file and the fix."""


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


@dataclass(frozen=True)
class SourceFile:
    """One file of SRC: ``path`` (local, readable), ``name`` (relative to SRC, what the
    samples are named after) and ``stat`` (size, mtime_ns of the original: a remote
    object's ETag stands for its mtime) for the resume plan and the append quick check."""

    path: str
    name: str
    stat: tuple


@dataclass
class Members:
    """Where each sample's image bytes lie: sample name -> (file, offset, length, size and
    mtime of the original). ``spool`` keeps the temporary folder alive as long as the
    inputs are (it is removed when they go)."""

    table: dict = field(default_factory=dict)
    spool: object = None
    mtimes: dict = field(default_factory=dict)  # file -> mtime_ns as the workers will see it

    def add(self, name: str, path: str, offset: int, length: int, stat: tuple) -> None:
        """Record sample ``name``'s image: ``length`` bytes at ``offset`` of ``path``."""
        self.table[name] = (path, offset, length, stat)

    def item(self, name: str) -> tuple:
        """The encode item of sample ``name``: (file, length, its mtime_ns, offset)."""
        path, offset, length, _ = self.table[name]
        if path not in self.mtimes:
            self.mtimes[path] = os.stat(path).st_mtime_ns
        return path, length, self.mtimes[path], offset

    def stat(self, name: str) -> tuple:
        """(length, mtime_ns of the original container): what the resume plan and the
        append quick check record for sample ``name``."""
        _, _, length, (_, mtime) = self.table[name]
        return length, mtime

    def read(self, name: str) -> bytes:
        """The image bytes of sample ``name`` (an append hashes them)."""
        path, offset, length, _ = self.table[name]
        with open(path, "rb") as f:
            return os.pread(f.fileno(), length, offset)


class Spool:
    """A private temporary folder (``mkdtemp`` under ``where``, default the system's temp
    folder) for bytes that cannot be read in place; removed with its last reference (or at
    exit), by the process that made it only (forked workers leave it alone)."""

    def __init__(self, where=None):
        self.where, self.dir, self.count = where, None, 0

    def write(self, hint: str, data: bytes) -> str:
        """A new spool file named after ``hint`` holding ``data``; its path."""
        path = self.new_file(hint)
        with open(path, "wb") as out:
            out.write(data)
        return path

    def new_file(self, hint: str) -> str:
        """The path of a new, empty spool file named after ``hint``."""
        if self.dir is None:
            if self.where:
                os.makedirs(self.where, exist_ok=True)
            self.dir = tempfile.mkdtemp(prefix="dlpack-spool-", dir=self.where)
            weakref.finalize(self, _remove, self.dir, os.getpid())
            log.info("spool folder for bytes that cannot be read in place: %s", self.dir)
        self.count += 1
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(hint))[-80:]
        return os.path.join(self.dir, f"{self.count:06d}-{stem}")


def _remove(folder: str, owner: int) -> None:
    import shutil

    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def download(store, name: str, spool: Spool) -> SourceFile:
    head = store.head(name)
    if head is None:
        raise FileNotFoundError(f"{store.where(name)}: no such object; fix SRC")
    path = spool.new_file(name)
    with open(path, "wb") as out:
        for start in range(0, head["size"], DOWNLOAD_CHUNK):
            end = min(head["size"], start + DOWNLOAD_CHUNK)
            out.write(store.get_range(name, start, end, etag=head["etag"]))
    tag = zlib.crc32((head["etag"] or "").encode())  # stands for the mtime: changes with it
    return SourceFile(path, name, (head["size"], tag))


def inflated(source: SourceFile, spool: Spool) -> SourceFile:
    """``source`` itself, or (gzip'd: by its first two bytes) a spool copy inflated in 4 MiB
    steps, never held in memory, and at most MAX_INFLATE times the gzip'd size (plus
    64 MiB): images do not compress, so more is a gzip bomb, cut there with a warning."""
    import gzip

    with open(source.path, "rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return source
    path, limit = spool.new_file(source.name), MAX_INFLATE * source.stat[0] + INFLATE_SLACK
    try:
        with gzip.open(source.path, "rb") as f, open(path, "wb") as out:
            while chunk := f.read(4 * 2**20):
                if out.tell() + len(chunk) > limit:
                    out.write(chunk[:limit - out.tell()])
                    log.warning("%s inflates to more than %d bytes (a gzip bomb?): read up to "
                                "there only", source.name, limit)
                    break
                out.write(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        log.warning("%s: gzip stream damaged (%s); its samples up to the damage are packed",
                    source.name, exc)
    return SourceFile(path, source.name, source.stat)
