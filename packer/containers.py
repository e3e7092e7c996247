"""Samples that live inside other files: WebDataset tars, Parquet, TFRecord, RecordIO.

What the three readers (tarinput.py, parquetinput.py, framed.py) share: which files SRC
names (a file, a folder, a glob or brace pattern ``train-{0000..0099}.tar``, local or
s3:// / gs:// / az://), the spool (a private temporary folder for bytes that cannot be
read where they lie: remote objects, gzip'd files, Parquet pages, split RecordIO
records), and the member table: where each sample's image bytes lie, as (file, offset,
length). A sample's name is ``CONTAINER/KEY`` (tar) or ``CONTAINER#N`` (a record or row
number), relative to SRC; that name and the SHA-256 of the image bytes identify it
for ``--append``. Workers read a member with one ``pread``; the rest of the conversion
is the folder conversion's (packing.py): shuffle, shards, journal, resume, manifest.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import tempfile
import weakref
import zlib
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

FORMATS = ("auto", "folder", "webdataset", "parquet", "tfrecord", "recordio")
SUFFIXES = {"webdataset": (".tar", ".tar.gz", ".tgz"), "parquet": (".parquet",),
            "tfrecord": (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz",
                         ".tfrecords.gz", ".tfrec.gz"),
            "recordio": (".rec",)}
SOURCE_OPTIONS = ("source_format", "image_key", "label_key", "spool")
DOWNLOAD_CHUNK = 32 * 2**20  # one ranged GET of a remote object
MAX_BRACE_ITEMS = 1_000_000  # a pattern naming more files than this is a typo


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

    def new_file(self, hint: str) -> str:
        """The path of a new, empty spool file named after ``hint``."""
        if self.dir is None:
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


def detect(src, given: str | None) -> str | None:
    """The input format of ``src``: ``given`` unless "auto"/None; else by the suffix of
    SRC or of the files in the folder SRC names. None: an image folder (scan.py)."""
    if given not in (None, "auto"):
        if given not in FORMATS:
            raise ValueError(f"--from {given!r}: expected one of {', '.join(FORMATS)}")
        return None if given == "folder" else given
    text = os.fspath(src)
    from dlpack_io.reader.remote.urls import is_remote

    names = [text] if is_remote(text) or not os.path.isdir(text) else \
        [e.name for e in os.scandir(text) if e.is_file() and not e.name.startswith(".")]
    kinds = {kind_of(n) for n in names} - {None}
    if len(kinds) > 1:
        raise ValueError(f"{src}: holds {' and '.join(sorted(kinds))} files; pass --from to "
                         f"say which to convert")
    if kinds and os.path.isdir(text) and any(e.is_dir() for e in os.scandir(text)):
        return None  # class folders beside a stray file: an image folder, as before
    if not kinds and (is_remote(text) or not os.path.isdir(text)):
        raise ValueError(f"{src}: not a folder, and not a file, pattern or URL of a known "
                         f"input format ({', '.join(s for v in SUFFIXES.values() for s in v)}); "
                         f"pass --from FORMAT")
    return kinds.pop() if kinds else None


def kind_of(name: str) -> str | None:
    """The input format a file name's suffix says, or None."""
    low = name.lower().rstrip("/")
    for kind, suffixes in SUFFIXES.items():
        if low.endswith(suffixes):
            return kind
    return None


def expand_braces(pattern: str) -> list:
    """``a{0..2}b{x,y}`` -> a0bx a0by a1bx ... (numeric ranges keep their zero padding)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    body, head, tail = m.group(1), pattern[:m.start()], pattern[m.end():]
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        lo, hi, width = int(r.group(1)), int(r.group(2)), len(r.group(1))
        if hi < lo or hi - lo >= MAX_BRACE_ITEMS:
            raise ValueError(f"{pattern}: range {{{body}}} must go up, naming at most "
                             f"{MAX_BRACE_ITEMS} files")
        items = [str(k).zfill(width) for k in range(lo, hi + 1)]
    else:
        items = body.split(",")
    out = [head + item + rest for item in items for rest in expand_braces(tail)]
    if len(out) > MAX_BRACE_ITEMS:
        raise ValueError(f"{pattern}: names more than {MAX_BRACE_ITEMS} files")
    return out


def local_files(src: str, kind: str) -> tuple[str, list]:
    """(root, [SourceFile]) of a local SRC: a file, a folder (its files of ``kind``, or
    every file with --from, sorted), or a glob / brace pattern (sorted as written)."""
    if os.path.isfile(src):
        root = os.path.dirname(os.path.abspath(src))
        paths = [os.path.abspath(src)]
    elif os.path.isdir(src):
        root = os.path.abspath(src)
        found = sorted(e.path for e in os.scandir(root) if e.is_file()
                       and not e.name.startswith(".") and not e.name.endswith(".idx"))
        paths = [p for p in found if kind_of(p) == kind] or found
    else:
        patterns = expand_braces(src)
        root = os.path.abspath(os.path.dirname(src.split("{")[0].split("*")[0]) or ".")
        paths = [os.path.abspath(p) for pat in patterns for p in
                 (sorted(glob.glob(pat)) if glob.has_magic(pat) else [pat])]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"{src}: {len(missing)} of the {len(paths)} files it names "
                                    f"do not exist, e.g. {missing[0]}; fix the pattern")
    if not paths:
        raise FileNotFoundError(f"{src}: no {kind} files found")
    return root, [SourceFile(p, os.path.relpath(p, root), _stat(p)) for p in paths]


def _stat(path: str) -> tuple:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def remote_files(src: str, kind: str, spool: Spool, storage_options=None) -> tuple[str, list]:
    """(root URL, [SourceFile]) of an s3:// / gs:// / az:// SRC, each object fetched into
    the spool through the storage seam (ranged GETs pinned to its ETag: an object replaced
    meanwhile is an error, never a mix of two versions)."""
    from dlpack_io.reader.remote.storage import Store

    base, _, last = src.rstrip("/").rpartition("/")
    if kind_of(last) is None and "{" not in last and "*" not in last:
        store, names = Store(src), None  # a prefix: every object of the format under it
    else:
        store = Store(base)
        names = expand_braces(last)
    listed = store.list() if names is None or any(glob.has_magic(n) for n in names) else {}
    if names is None:
        names = sorted(n for n in listed if kind_of(n) == kind and "/" not in n)
    elif listed:
        import fnmatch

        names = [m for n in names for m in sorted(fnmatch.filter(listed, n))]
    if not names:
        raise FileNotFoundError(f"{src}: no {kind} objects found there")
    return store.url, [_download(store, name, spool) for name in names]


def _download(store, name: str, spool: Spool) -> SourceFile:
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
    """``source`` itself, or (gzip'd: by its first two bytes) a spool copy inflated,
    bounded by the disk only (never held in memory)."""
    import gzip
    import shutil

    with open(source.path, "rb") as f:
        if f.read(2) != b"\x1f\x8b":
            return source
    path = spool.new_file(source.name)
    try:
        with gzip.open(source.path, "rb") as f, open(path, "wb") as out:
            shutil.copyfileobj(f, out, 4 * 2**20)
    except (OSError, EOFError, zlib.error) as exc:
        log.warning("%s: gzip stream damaged (%s); its samples up to the damage are packed",
                    source.path, exc)
    return SourceFile(path, source.name, source.stat)


def source_files(src, kind: str, spool: Spool) -> tuple[str, list]:
    """(root, [SourceFile]) of SRC, remote objects fetched into the spool."""
    from dlpack_io.reader.remote.urls import is_remote

    text = os.fspath(src)
    return remote_files(text, kind, spool) if is_remote(text) else local_files(text, kind)


def scan_container(src, kind: str, labels: bool, source: dict):
    """The Inputs of a container SRC of format ``kind`` (``source``: --image-key,
    --label-key, --spool); every bad sample is a reject naming file and offset."""
    from dlpack_io.packer.jsonlist import rows_inputs
    from dlpack_io.packer.scan import Inputs

    spool = Spool(source.get("spool"))
    root, files = source_files(src, kind, spool)
    members = Members(spool=spool)
    if kind == "webdataset":
        from dlpack_io.packer.tarinput import read_tars as read
    elif kind == "parquet":
        from dlpack_io.packer.parquetinput import read_parquet as read
    else:
        from dlpack_io.packer.framed import read_framed as read
    rows, classes, schema = read(files, members, spool, kind=kind, image_key=source.get(
        "image_key"), label_key=source.get("label_key"), root=root)
    if not rows:
        raise ValueError(f"{src}: no samples found in {len(files)} {kind} file(s)")
    log.info("%s: %d samples in %d %s file(s)", src, len(rows), len(files), kind)
    paths, label_list, classes, schema, values = rows_inputs(rows, classes, schema, labels)
    bad = {i: v for i, v in enumerate(values) if isinstance(v, str)}
    return Inputs(root, paths, label_list, classes, fields=schema or None, field_values=values,
                  bad=bad or None, members=members)
