"""Read-only access to one shard: the index table, zero-copy record payloads, their field
blocks, and the safe reads they stand on (regular files only, ``pread`` for what is checked,
copies of mapped memory under the C extension's SIGBUS guard).

Shards open lazily, once per process (a forked worker re-opens its own): an LMDB
environment must never cross a fork, and lazily opened mmaps cost nothing until read.
Every structural check happens at open (reader/format/checks.py), on a private copy of the
header and index read with ``pread``, so ``payload(i)`` is a bare slice and nothing a
later change of the file does can make an index entry point elsewhere. What was mapped
is remembered (device, inode, size, mtime): ``check_unchanged()`` says when the file
changed under the map (the cause of SIGBUS), cheaply enough to call once per batch."""
from __future__ import annotations

import logging
import mmap
import os

import numpy as np

from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.checks import check_index, check_lmdb, open_regular
from dlpack_io.reader.format.spec import native_jpeg

# What a shard knows about its records' field blocks (format 3), apart from ``Shard`` so
# that the image path stays as it was: the image columns of the index are kept as the
# 32-byte INDEX_DTYPE every reader of images uses, the field columns beside them.

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


# Reading files of a data set that may come from anyone, and files that may change.
#
# Regular files only, never blocking; reads that cannot fault (``pread``) for what is
# checked once at open. Copies of mapped memory are made under the native SIGBUS guard
# (``guarded_array``, below).
#
# A FIFO opened for reading blocks until a writer appears, forever (tar keeps FIFOs); a
# symlink to /dev/zero reads without end. Every file a reader opens goes through
# ``format.regular.open_regular`` (O_NONBLOCK, then fstat: S_ISREG or a FormatError naming it).

def read_limited(path: str, limit: int) -> bytes:
    """The whole regular file ``path``, refusing one larger than ``limit`` bytes."""
    fd, st = open_regular(path)
    try:
        if st.st_size > limit:
            raise fmt.FormatError(f"{path}: {st.st_size} bytes, more than the {limit}-byte limit "
                                  f"for this file: not a dlpack file")
        chunks, total = [], 0
        while True:  # st_size may lie (procfs-like files): read with the limit, not the size
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise fmt.FormatError(f"{path}: more than the {limit}-byte limit for this file")
        return b"".join(chunks)
    finally:
        os.close(fd)


class ShardChangedError(fmt.FormatError):
    """A shard file changed (truncated, appended to, rewritten) while it was mapped."""

    def __init__(self, path: str, change: str):
        super().__init__(f"{path}: changed on disk while this process was reading it ({change}); "
                         f"someone rewrote or truncated the data set in place: stop, let them "
                         f"finish, and restart from a checkpoint")
        self.path, self.change = path, change

    def __reduce__(self):
        return (type(self), (self.path, self.change))


def identity(st: os.stat_result) -> tuple:
    """What identifies the version of a file that was opened: device, inode, size, mtime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def pread_all(fd: int, size: int, offset: int, path: str) -> bytes:
    """Exactly ``size`` bytes at ``offset`` (a read cannot fault, unlike a mapped page)."""
    parts, done = [], 0
    while done < size:
        chunk = os.pread(fd, min(size - done, 1 << 28), offset + done)
        if not chunk:
            raise fmt.FormatError(f"{path}: file ended at {offset + done} while reading "
                                  f"{size} bytes at {offset}: the shard is truncated")
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


def check_regular(path: str) -> None:
    """FileNotFoundError naming the shard, or FormatError unless it is a regular file."""
    try:
        fd, _ = open_regular(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: shard listed in the manifest is missing") from None
    os.close(fd)


# Copies done by the C extension without the GIL, with numpy fallbacks of the same meaning:
# a block of HWC pixels into CHW planes (flipped as asked), many such crops of one mapped shard
# at once, byte ranges gathered into one buffer, and plain copies of mapped memory. The
# extension turns a SIGBUS (a mapped file truncated under the read) into MappedFileError
# (:func:`is_mapped_file_error`), so a shard cut short under a reader is an error naming it,
# never a crash: every read of mapped memory that Python code keeps goes through here.

_jpeg = native_jpeg()  # looked up once (see format/spec.py): branched on per record


def to_chw(src, offset: int, row_stride: int, h: int, w: int, dst: np.ndarray,
           dst_offset: int, flip_h: bool, flip_v: bool, pixel_size: int = 3) -> None:
    """Copy the (h, w) block of RGB (``pixel_size`` 3) or RGBX (4) pixels at byte
    ``offset`` of the contiguous buffer ``src`` (rows ``row_stride`` bytes apart) into the
    contiguous uint8 array ``dst`` at byte ``dst_offset`` as three (h, w) planes, flipped
    as asked."""
    if _jpeg is not None:
        _jpeg.to_chw(src, offset, row_stride, h, w, dst, dst_offset, bool(flip_h),
                     bool(flip_v), pixel_size)
        return
    flat = np.frombuffer(src, dtype=np.uint8)
    if min(h, w, offset) < 0 or row_stride < pixel_size * w or \
            offset + (h - 1) * row_stride + pixel_size * w > flat.size:
        raise ValueError(f"to_chw: a {h}x{w}x{pixel_size} block at offset {offset} (row "
                         f"stride {row_stride}) does not fit in a {flat.size}-byte buffer")
    block = np.lib.stride_tricks.as_strided(flat[offset:], (h, w, 3), (row_stride, pixel_size, 1),
                                            writeable=False)
    view = block[::-1] if flip_v else block
    view = view[:, ::-1] if flip_h else view
    out = dst.reshape(-1)[dst_offset:dst_offset + 3 * h * w].reshape(3, h, w)
    out[...] = view.transpose(2, 0, 1)


def to_chw_array(pixels: np.ndarray, dst: np.ndarray, dst_offset: int, flip_h, flip_v) -> None:
    """:func:`to_chw` of a whole C-contiguous (h, w, 3 or 4) array."""
    h, w, ps = pixels.shape
    to_chw(pixels, 0, w * ps, h, w, dst, dst_offset, flip_h, flip_v, ps)


def gather(src, src_offsets, lengths, dst: np.ndarray, dst_offsets) -> None:
    """Copy byte ranges ``src[src_offsets[i]:+lengths[i]]`` to ``dst[dst_offsets[i]:]``
    (one C call without the GIL; a numpy loop without the extension)."""
    so = np.ascontiguousarray(src_offsets, dtype=np.int64)
    ln = np.ascontiguousarray(lengths, dtype=np.int64)
    do = np.ascontiguousarray(dst_offsets, dtype=np.int64)
    if _jpeg is not None:
        _jpeg.gather(src, so, ln, dst, do)
        return
    flat = np.frombuffer(src, dtype=np.uint8)
    out = dst.reshape(-1)
    for a, n, b in zip(so.tolist(), ln.tolist(), do.tolist()):
        if a < 0 or b < 0 or a + n > flat.size or b + n > out.size:
            raise ValueError(f"gather: {n} bytes from {a} to {b} do not fit")
        out[b:b + n] = flat[a:a + n]


def crop_chw(src, params: np.ndarray, h: int, w: int, dst: np.ndarray) -> None:
    """:func:`to_chw` for many (h, w) RGB blocks of one buffer: ``params`` rows are
    (src_offset, row_stride, flip_h, flip_v, dst_offset); one C call without the GIL."""
    p = np.ascontiguousarray(params, dtype=np.int64)
    if _jpeg is not None:
        _jpeg.crop_chw(src, p, h, w, dst)
        return
    for off, stride, fh, fv, dst_off in p.tolist():
        to_chw(src, off, stride, h, w, dst, dst_off, fh, fv)


def is_mapped_file_error(exc: BaseException) -> bool:
    """True for the extension's MappedFileError: a SIGBUS turned into an exception because
    the mapped file was truncated under the read."""
    mapped = getattr(_jpeg, "MappedFileError", None)
    return mapped is not None and isinstance(exc, mapped)


_ZERO = np.zeros(1, dtype=np.int64)


def guarded_array(view) -> np.ndarray:
    """A writable uint8 copy of ``view``, made by the native code that turns a SIGBUS
    (the mapped file truncated under the read) into MappedFileError, a ValueError."""
    out = np.empty(len(view), dtype=np.uint8)
    if len(view):
        gather(view, _ZERO, np.array([len(view)], dtype=np.int64), out, _ZERO)
    return out


def guarded_copy(view) -> bytes:
    """bytes(view), copied under the SIGBUS guard (see guarded_array)."""
    return guarded_array(view).tobytes()


log = logging.getLogger(__name__)


class _Shard(FieldColumns):
    def __init__(self, path: str, expected_crc: int | None = None, *,
                 num_classes: int | None = None, max_pixels: int = fmt.DEFAULT_MAX_PIXELS):
        self.path = path
        self.expected_crc = expected_crc
        self.num_classes, self.max_pixels = num_classes, int(max_pixels)
        self._pid = None
        self._index = None
        self._identity = None
        self._warned_replaced = False

    def _ensure_open(self) -> None:
        if self._pid != os.getpid():
            self._pid = None
            self._open()
            self._pid = os.getpid()

    @property
    def index(self) -> np.ndarray:
        """The shard's index table (INDEX_DTYPE entries), validated, read-only."""
        self._ensure_open()
        return self._index

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self):
        return {"path": self.path, "expected_crc": self.expected_crc,
                "num_classes": self.num_classes, "max_pixels": self.max_pixels}

    def __setstate__(self, state):
        self.__init__(state["path"], state["expected_crc"], num_classes=state.get("num_classes"),
                      max_pixels=state.get("max_pixels", fmt.DEFAULT_MAX_PIXELS))

    def file_view(self):
        """The whole shard file as one zero-copy buffer, or None when records do not lie
        in one mapped file (LMDB): the batch path then reads record by record."""
        return None

    def _check_crc(self, what: str, stored: int, data) -> None:
        actual = fmt.crc32(data)
        if not isinstance(stored, int) or isinstance(stored, bool) or not 0 <= stored < 2**32:
            raise fmt.FormatError(f"{self.path}: {what} checksum {stored!r:.40} is not a CRC-32")
        if actual != stored:
            raise fmt.FormatError(f"{self.path}: {what} checksum mismatch (stored {stored:#010x}, "
                                  f"computed {actual:#010x}): the shard is damaged")

    def _check_manifest_crc(self, crc: int) -> None:
        if self.expected_crc is not None and crc != self.expected_crc:
            raise fmt.FormatError(f"{self.path}: shard checksum {crc:#010x} differs from the "
                                  f"manifest's {self.expected_crc:#010x}: the file was replaced "
                                  f"or damaged")

    def _check_index(self, index: np.ndarray, **layout) -> None:
        check_index(index, self.path, num_classes=self.num_classes, max_pixels=self.max_pixels,
                    **layout)

    def check_unchanged(self) -> None:
        """Raise ShardChangedError if the file this process opened changed in place since.

        Two system calls; a no-op for a shard not opened in this process. A file replaced
        by rename (what ``dlpack convert --overwrite`` does) is not an error: the open map
        still holds the old, intact file; it is logged once.
        """
        if self._pid != os.getpid():
            return
        dev, ino, size, mtime = self._identity
        mapped_size = self._mapped_size()
        if mapped_size is not None and mapped_size != size:
            raise ShardChangedError(self.path, f"{size} bytes when opened, {mapped_size} now")
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == (dev, ino):
            if st.st_size != size:
                raise ShardChangedError(self.path, f"{size} bytes when opened, {st.st_size} now")
            if st.st_mtime_ns != mtime:
                raise ShardChangedError(self.path, "modified in place: same size, new mtime")
        elif not self._warned_replaced:
            self._warned_replaced = True
            log.warning("%s was %s on disk; this process keeps reading the version it opened",
                        self.path, "deleted" if st is None else "replaced")

    def _mapped_size(self):
        return None


class RecordShard(_Shard):
    """A ``.rec`` shard, memory-mapped read-only."""

    def _open(self) -> None:
        try:
            fd, st = open_regular(self.path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path}: shard listed in the manifest is missing") from None
        try:
            header = fmt.unpack_header(os.pread(fd, fmt.HEADER_SIZE, 0), st.st_size, self.path)
            self._check_manifest_crc(header.header_crc)
            index_bytes = pread_all(fd, header.index_size, header.index_offset, self.path)
            self._check_crc("index", header.index_crc, index_bytes)
            index = fmt.index_from_buffer(index_bytes, header.num_records, self.path, header.version)
            self._check_index(index, data_offset=header.data_offset, data_end=header.index_offset)
            try:
                mm = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_READ)
            except ValueError:  # the file shrank between the fstat above and the map
                raise ShardChangedError(self.path, f"{st.st_size} bytes when opened, "
                                                   f"{os.fstat(fd).st_size} now") from None
        finally:
            os.close(fd)
        self._header, self._mm, self._view = header, mm, memoryview(mm)
        self._keep_index(index)
        self._identity = identity(st)

    def record_count(self) -> int:
        """Records in the shard, from its header alone (checked against the manifest CRC)."""
        if self._pid == os.getpid():
            return len(self._index)
        try:
            fd, st = open_regular(self.path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.path}: shard listed in the manifest is missing") from None
        try:
            header = fmt.unpack_header(os.pread(fd, fmt.HEADER_SIZE, 0), st.st_size, self.path)
        finally:
            os.close(fd)
        self._check_manifest_crc(header.header_crc)
        return header.num_records

    @property
    def header(self) -> fmt.ShardHeader:
        """The parsed, validated header page."""
        self._ensure_open()
        return self._header

    def payload(self, i: int) -> memoryview:
        """Zero-copy bytes of record ``i``."""
        self._ensure_open()
        start = int(self._index["offset"][i])
        return self._view[start:start + int(self._index["length"][i])]

    def span(self, start: int, stop: int) -> memoryview:
        """Zero-copy bytes [start, stop) of the shard file (used by verify for padding)."""
        self._ensure_open()
        return self._view[start:stop]

    def file_view(self) -> memoryview:
        """The memory-mapped file up to the end of its metadata (one C call can then copy
        many records)."""
        h = self.header
        return self.span(0, h.meta_offset + h.meta_size)

    def meta(self) -> dict:
        """The shard's metadata JSON (source paths and position in the data set)."""
        h = self.header
        data = guarded_copy(self._view[h.meta_offset:h.meta_offset + h.meta_size])
        self._check_crc("metadata", h.meta_crc, data)
        return fmt.decode_json(data, f"{self.path} metadata")

    def _mapped_size(self):
        return self._mm.size()  # fstat of the mapped file itself, even if renamed over


# lmdb refuses to open one environment twice in a process, so every LmdbShard of a
# process over the same file shares one environment and one long read transaction.
_LMDB_OPEN: dict = {}
# Files whose structure ``check_lmdb`` passed: realpath -> (identity, number of keys). Inherited
# by forked workers, so the walk runs once per file per data set, not per process.
_LMDB_CHECKED: dict = {}


def _lmdb_keys(path: str) -> int:
    """Keys in the LMDB file ``path`` after checking its structure (once per file version)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    cached = _LMDB_CHECKED.get(real)
    if cached is not None and cached[0] == identity(st):
        return cached[1]
    keys = check_lmdb(real)
    _LMDB_CHECKED[real] = (identity(st), keys)
    return keys


def _lmdb_txn(path: str):
    import lmdb

    key = (os.getpid(), os.path.realpath(path))
    if key not in _LMDB_OPEN:
        # py-lmdb refuses to open an environment that is open in this process, and a forked
        # child inherits the parent's. Closing the child's copy (read-only, lock-free, so no
        # shared lock table) leaves the parent's untouched and lets this process reopen it.
        for stale in [k for k in _LMDB_OPEN if k[1] == key[1] and k[0] != key[0]]:
            _LMDB_OPEN.pop(stale)[0].close()
        _lmdb_keys(path)  # liblmdb trusts its pages: never hand it an unchecked file
        env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False,
                        max_readers=1, max_spare_txns=0)
        _LMDB_OPEN[key] = (env, env.begin(buffers=True))
    return _LMDB_OPEN[key][1]


class LmdbShard(_Shard):
    """A single-file LMDB shard, opened readonly, lock-free, without readahead."""

    def _open(self) -> None:
        import lmdb

        check_regular(self.path)  # a regular file, and a FIFO never blocks us
        st = os.stat(self.path)
        try:
            txn = _lmdb_txn(self.path)
            meta_bytes, index_bytes = txn.get(fmt.LMDB_META_KEY), txn.get(fmt.LMDB_INDEX_KEY)
        except lmdb.Error as exc:
            raise fmt.FormatError(f"{self.path}: not a readable LMDB shard ({exc})") from None
        if meta_bytes is None or index_bytes is None:
            raise fmt.FormatError(f"{self.path}: LMDB shard lacks its {fmt.LMDB_META_KEY!r} or "
                                  f"{fmt.LMDB_INDEX_KEY!r} key: incomplete or not a dlpack shard")
        meta_bytes, index_bytes = guarded_copy(meta_bytes), guarded_copy(index_bytes)
        self._check_manifest_crc(fmt.crc32(meta_bytes))
        meta = fmt.decode_json(meta_bytes, f"{self.path} metadata")
        version = meta.get("version")
        if meta.get("magic") != fmt.MAGIC.decode() or version not in fmt.READABLE_VERSIONS \
                or isinstance(version, bool):
            raise fmt.FormatError(f"{self.path}: magic/version {meta.get('magic')!r:.40}/"
                                  f"{version!r:.40}, expected {fmt.MAGIC.decode()!r}/"
                                  f"one of {fmt.READABLE_VERSIONS}")
        num = meta.get("num_records")
        if not isinstance(num, int) or isinstance(num, bool) or num != _lmdb_keys(self.path) - 2:
            raise fmt.FormatError(f"{self.path}: num_records {num!r:.40} is not the number of "
                                  f"record keys ({_lmdb_keys(self.path) - 2})")
        self._check_crc("index", meta.get("index_crc", -1), index_bytes)
        index = fmt.index_from_buffer(index_bytes, num, self.path, version)
        self._check_index(index)
        self._txn, self._meta = txn, meta
        self._keep_index(index)
        self._identity = identity(st)

    def record_count(self) -> int:
        """Records in the shard: its keys but the index and metadata (structure checked)."""
        check_regular(self.path)
        return max(_lmdb_keys(self.path) - 2, 0)

    def _value(self, i: int) -> memoryview:
        self._ensure_open()  # the image, then the field block (format 3)
        value = self._txn.get(fmt.lmdb_record_key(i))
        if value is None or len(value) != int(self._index["length"][i]) + self.fields_entry(i)[0]:
            raise fmt.FormatError(f"{self.path}: record {i} is missing from the LMDB shard or "
                                  f"not the length its index entry says")
        return value

    def payload(self, i: int) -> memoryview:
        """Zero-copy bytes of record ``i`` (valid while this process keeps the shard open)."""
        value = self._value(i)
        return value if self._fields is None else value[:int(self._index["length"][i])]

    def fields_block(self, i: int) -> memoryview:
        """Zero-copy bytes of record ``i``'s field block (empty in a format-2 shard)."""
        return self._value(i)[int(self._index["length"][i]):]

    def meta(self) -> dict:
        """The shard's metadata JSON (header facts, source paths, position)."""
        self._ensure_open()
        return self._meta


def open_shard(dataset_dir, entry: dict, data_format: str, *, num_classes: int | None = None,
               max_pixels: int = fmt.DEFAULT_MAX_PIXELS):
    """A lazily opened shard object for one manifest shard entry; records are checked
    against ``num_classes`` labels and ``max_pixels`` when it opens."""
    path = os.path.join(os.fspath(dataset_dir), fmt.check_shard_name(entry["name"], "manifest"))
    cls = LmdbShard if data_format == "lmdb" else RecordShard
    return cls(path, entry["crc"], num_classes=num_classes, max_pixels=max_pixels)
