"""What is read from disk checked before it is trusted: every index entry of a shard
(vectorised, once, at open), an LMDB file's own structure, and the regular-file rule for
inputs and data set files (no links, FIFOs or devices planted in a folder)."""
from __future__ import annotations

import errno
import os
import stat
import struct

import numpy as np

from dlpack_io.reader.format import spec as fmt
from dlpack_io.reader.format.spec import FormatError

# Every index entry of a shard checked once, when the shard is opened, vectorised.
#
# After ``check_index`` passes, nothing read from the index can size an allocation beyond
# the pixel limit, point outside the data section, overlap another record, or name a class
# that does not exist; readers then slice and size without further checks. All arithmetic is
# done in uint64 on values bounded first, so a hostile entry cannot wrap a sum or a product.
# Cost: a few vectorised passes over the index (docs/benchmarks.md, "Opening a data set").

def _first(mask: np.ndarray):
    """Index of the first True in ``mask``, or None (``any`` first: the common case)."""
    return int(np.argmax(mask)) if mask.any() else None


def _fail(where: str, i: int, entry, problem: str):
    raise fmt.FormatError(
        f"{where}: record {i} (offset {int(entry['offset'])}, length {int(entry['length'])}, "
        f"{int(entry['height'])}x{int(entry['width'])}x{int(entry['channels'])}, kind "
        f"{int(entry['kind'])}, label {int(entry['label'])}): {problem}")


def check_pixels(index: np.ndarray, where: str, max_pixels: int) -> None:
    """Kind, channels and size of every record: known kind, 3 channels, 1..MAX_SIDE per
    side, height x width <= ``max_pixels``, raw payloads exactly height x width x 3."""
    h, w = index["height"].astype(np.uint64), index["width"].astype(np.uint64)
    checks = (
        (index["kind"] > max(fmt.KINDS),  # kinds are 0, 1, 2 and 3
         lambda e: f"unknown record kind {int(e['kind'])} (0 JPEG, 1 raw, 2 PNG/WebP file, "
                   f"3 decoded planes)"),
        (index["channels"] != 3, lambda e: f"{int(e['channels'])} channels, the format stores RGB (3)"),
        ((h < 1) | (w < 1) | (h > fmt.MAX_SIDE) | (w > fmt.MAX_SIDE),
         lambda e: f"height and width must be 1..{fmt.MAX_SIDE}"),
        (index["length"] < 1, lambda e: "empty payload"),
    )
    for mask, problem in checks:
        i = _first(mask)
        if i is not None:
            _fail(where, i, index[i], problem(index[i]))
    pixels = h * w  # each side <= 65535 now: the product fits easily
    i = _first(pixels > np.uint64(max_pixels))
    if i is not None:
        _fail(where, i, index[i], f"{int(pixels[i])} pixels, more than the limit of {max_pixels} "
                                  f"(a decompression bomb, or a data set of huge images: open it "
                                  f"with Dataset(..., max_pixels=N) if you trust it)")
    raw = index["kind"] == fmt.KIND_RAW
    i = _first(raw & (pixels * np.uint64(3) != index["length"].astype(np.uint64)))
    if i is not None:
        _fail(where, i, index[i], f"a raw record of {int(h[i])}x{int(w[i])}x3 pixels must be "
                                  f"{int(pixels[i]) * 3} bytes")


def check_labels(index: np.ndarray, where: str, num_classes: int) -> None:
    """Labels index the manifest's classes; a data set without classes has only -1."""
    labels = index["label"]
    if num_classes == 0:
        i = _first(labels != -1)
        expected = "-1 (the data set has no classes)"
    else:
        i = _first((labels < 0) | (labels >= num_classes))
        expected = f"0..{num_classes - 1}"
    if i is not None:
        _fail(where, i, index[i], f"label {int(labels[i])} outside the classes: expected {expected}")


def check_layout(index: np.ndarray, where: str, data_offset: int, data_end: int) -> None:
    """Record shards: records back to back in index order (format.record_offsets), so they
    are ordered, disjoint, inside the data section, and every gap is alignment padding."""
    spans = index["length"].astype(np.uint64)  # u32 + u32 in u64: cannot wrap
    if "fields_length" in index.dtype.names:  # version 3: the field block follows the image
        spans += index["fields_length"]
    starts, end = fmt.record_offsets(spans, data_offset)
    i = _first(index["offset"] != starts)
    if i is not None:
        _fail(where, i, index[i], f"starts at {int(index['offset'][i])}, the layout puts it at "
                                  f"{int(starts[i])} (records are stored in index order, back to "
                                  f"back, {fmt.RECORD_ALIGN}-byte aligned)")
    if end != data_end:
        raise fmt.FormatError(f"{where}: the records end at {end}, the data section at {data_end}: "
                              f"bytes no record covers, or records past the data section")


def check_index(index: np.ndarray, where: str, *, data_offset: int | None = None,
                data_end: int | None = None, num_classes: int | None = None,
                max_pixels: int = fmt.DEFAULT_MAX_PIXELS) -> None:
    """Raise FormatError naming ``where`` and the first bad record, or return.

    ``data_offset``/``data_end``: the data section of a record shard (None for LMDB, whose
    offsets must be 0); ``num_classes``: the manifest's class count (None: labels unchecked).
    """
    check_pixels(index, where, int(max_pixels))
    fmt.check_index_fields(index, where)  # kind, EXIF orientation, colour
    if data_offset is None:
        i = _first(index["offset"] != 0)
        if i is not None:
            _fail(where, i, index[i], "LMDB index entries must have offset 0")
    else:
        check_layout(index, where, data_offset, data_end)
    if num_classes is not None:
        check_labels(index, where, num_classes)


# Open a file of a data set only when it is a regular file: a FIFO planted in its place would
# block a reader forever, a device or a directory would feed it bytes no writer made. Used by
# every reader of shard and manifest files and by the LMDB structure check, and (``open_input``,
# ``read_input``) by the packer for everything it reads as input: images, sidecars, masks,
# lists, COCO files, the destination's own shards during an append.

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def describe_mode(mode: int) -> str:
    """'a FIFO (named pipe)', 'a directory', ... for a st_mode that is not a regular file."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class NotRegularFile(OSError):
    """An input that is a FIFO, a device, a socket or a directory (``strerror`` says which)."""


class InputTooLarge(OSError):
    """An input larger than its reader takes (``strerror`` says how large, and the limit)."""


def open_input(path) -> tuple[int, os.stat_result]:
    """(fd, fstat) of ``path`` opened read-only without blocking (a FIFO opens at once,
    with no writer); NotRegularFile naming what it is unless it is a regular file. Links
    are followed: what they lead to must be a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{describe_mode(st.st_mode)}, not a regular "
                                               f"file", os.fspath(path))
        os.set_blocking(fd, True)  # regular files never block; later reads are plain reads
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_input(path, limit: int | None = None) -> bytes:
    """The bytes of the regular file ``path`` (open_input), at most ``limit``: a larger
    one is InputTooLarge, found from its size before anything is read."""
    fd, st = open_input(path)
    with open(fd, "rb") as f:
        if limit is not None and st.st_size > limit:
            raise InputTooLarge(errno.EFBIG, f"{st.st_size} bytes, more than the {limit} "
                                             f"read from one such file", os.fspath(path))
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:  # grew since fstat
        raise InputTooLarge(errno.EFBIG, f"more than the {limit} bytes read from one such "
                                         f"file", os.fspath(path))
    return data


def open_regular(path: str) -> tuple[int, os.stat_result]:
    """(fd, fstat) of ``path`` opened read-only; FormatError unless it is a regular file.

    Symlinks are followed (data sets assembled from links are legitimate); what they lead
    to must be a regular file. Raises FileNotFoundError when ``path`` does not exist.
    """
    try:
        return open_input(path)
    except NotRegularFile as exc:
        raise FormatError(f"{path}: {exc.strerror}; a data set holds only regular files "
                          f"(re-copy it)") from None


# Check the structure of an LMDB shard before liblmdb sees it.
#
# liblmdb trusts its file: a crafted page (a node pointer past the page, a data size past the
# file, a branch page with one key) makes it read outside its map or abort. So before a shard
# is opened we read its meta pages and walk its B-tree ourselves with ``os.pread`` (which
# cannot fault), checking every page and node liblmdb's lookups would touch. A file that
# passes can only make liblmdb read inside the file: wrong bytes at worst, which the record
# CRCs catch. Layout of LMDB 0.9 (64-bit), as py-lmdb bundles it:
#
#   page header (16 B): pgno u64 @0, pad u16 @8, flags u16 @10, lower u16 @12, upper u16 @14
#                       (overflow pages: page count u32 @12); node pointers u16[] from @16
#   meta (pages 0, 1):  magic u32 @16, version u32 @20, dbs[FREE] @40, dbs[MAIN] @88
#                       (db: pad u32 (FREE: page size) +0, flags u16 +4, depth u16 +6,
#                       branch/leaf/overflow pages, entries u64 +8/+16/+24/+32, root u64 +40),
#                       last page u64 @136, txn id u64 @144; liblmdb reads the meta with the
#                       larger txn id
#   node (8 B + key + data): lo u16, hi u16, flags u16, key size u16; branch: child page
#                       lo | hi << 16 | flags << 32; leaf: data size lo | hi << 16, flag
#                       F_BIGDATA (1): data is the u64 number of its first overflow page

MAGIC, VERSION = 0xBEEFC0DE, 1
P_BRANCH, P_LEAF, P_META = 0x01, 0x02, 0x08
F_BIGDATA = 0x01
HEADER, NODE = 16, 8
MAX_DEPTH = 32          # liblmdb's cursor stack
P_INVALID = 2**64 - 1   # root of an empty database
_META = struct.Struct("<QHHHHII")  # pgno, pad, flags, lower, upper, magic, version


class _Walk:
    """State of one walk: file, page size, last valid page, pages seen, keys counted."""

    def __init__(self, fd: int, path: str, psize: int, last: int):
        self.fd, self.path, self.psize, self.last = fd, path, psize, last
        self.seen: set = set()
        self.keys = 0

    def fail(self, pgno, problem: str):
        where = f"page {pgno}" if pgno is not None else "meta pages"
        raise fmt.FormatError(f"{self.path}: damaged LMDB structure at {where}: {problem}; "
                              f"refusing to open it (run 'dlpack verify', or re-copy the shard)")

    def page(self, pgno: int) -> bytes:
        if not 2 <= pgno <= self.last:
            self.fail(pgno, f"page number outside 2..{self.last}")
        if pgno in self.seen:
            self.fail(pgno, "page reached twice (a cycle or a shared subtree)")
        self.seen.add(pgno)
        data = os.pread(self.fd, self.psize, pgno * self.psize)
        if len(data) != self.psize:
            self.fail(pgno, "page beyond the end of the file")
        return data


def _meta(fd: int, path: str, offset: int) -> tuple:
    data = os.pread(fd, 152, offset)
    if len(data) < 152:
        raise fmt.FormatError(f"{path}: not an LMDB file (shorter than its meta pages)")
    _, _, flags, _, _, magic, version = _META.unpack_from(data)
    if magic != MAGIC or not flags & P_META or version != VERSION:
        raise fmt.FormatError(f"{path}: not an LMDB 0.9 file (meta page at {offset}: magic "
                              f"{magic:#x}, flags {flags:#x}, version {version})")
    psize = struct.unpack_from("<I", data, 40)[0]
    main_flags, depth = struct.unpack_from("<HH", data, 92)
    root, last, txnid = (struct.unpack_from("<Q", data, o)[0] for o in (128, 136, 144))
    return psize, main_flags, depth, root, last, txnid


def _nodes(w: _Walk, pgno: int, data: bytes, want: int):
    """Yield (offset, lo, hi, flags, key size) of each node of a branch/leaf page."""
    _, _, flags, lower, upper = struct.unpack_from("<QHHHH", data)
    if struct.unpack_from("<Q", data)[0] != pgno:
        w.fail(pgno, "the page does not carry its own number")
    if flags != want:
        w.fail(pgno, f"flags {flags:#x}, expected a {'branch' if want == P_BRANCH else 'leaf'} page")
    if not (HEADER <= lower <= upper <= w.psize) or (lower - HEADER) % 2:
        w.fail(pgno, f"free-space bounds {lower}..{upper} impossible in a {w.psize}-byte page")
    count = (lower - HEADER) // 2
    if count < (2 if want == P_BRANCH else 1):
        w.fail(pgno, f"{count} keys (liblmdb asserts on such a page)")
    for ptr in struct.unpack_from(f"<{count}H", data, HEADER):
        if ptr < upper or ptr % 2 or ptr + NODE > w.psize:
            w.fail(pgno, f"node pointer {ptr} outside the node area {upper}..{w.psize - NODE}")
        lo, hi, nflags, ksize = struct.unpack_from("<HHHH", data, ptr)
        if ptr + NODE + ksize > w.psize:
            w.fail(pgno, f"a {ksize}-byte key runs past the page")
        yield ptr, lo, hi, nflags, ksize


def _leaf(w: _Walk, pgno: int, data: bytes) -> None:
    end_of_file = (w.last + 1) * w.psize
    for ptr, lo, hi, nflags, ksize in _nodes(w, pgno, data, P_LEAF):
        size, start = lo | hi << 16, ptr + NODE + ksize
        if nflags == 0:
            if start + size > w.psize:
                w.fail(pgno, f"a {size}-byte value runs past the page")
        elif nflags == F_BIGDATA:
            if start + 8 > w.psize:
                w.fail(pgno, "an overflow page number runs past the page")
            first = struct.unpack_from("<Q", data, start)[0]
            if not 2 <= first <= w.last or first * w.psize + HEADER + size > end_of_file:
                w.fail(pgno, f"a {size}-byte value on overflow page {first} runs past the "
                             f"last page {w.last}")
        else:
            w.fail(pgno, f"node flags {nflags:#x} (sub-databases and duplicates are not used "
                         f"by dlpack shards)")
        w.keys += 1


def _walk(w: _Walk, pgno: int, depth: int, levels: int) -> None:
    data = w.page(pgno)
    if depth == levels:
        _leaf(w, pgno, data)
        return
    for _, lo, hi, nflags, _ in list(_nodes(w, pgno, data, P_BRANCH)):
        _walk(w, pgno=lo | hi << 16 | nflags << 32, depth=depth + 1, levels=levels)


def check_lmdb(path: str) -> int:
    """Check the LMDB file ``path``; return the number of keys of its main database.

    Raises FormatError naming the file and the damaged page, or FileNotFoundError.
    """
    fd, st = open_regular(path)
    try:
        m0 = _meta(fd, path, 0)
        psize = m0[0]
        if psize < 512 or psize > 32768 or psize & (psize - 1):
            raise fmt.FormatError(f"{path}: LMDB page size {psize} is not a power of two in "
                                  f"512..32768: damaged meta page")
        m1 = _meta(fd, path, psize)
        if m1[0] != psize:
            raise fmt.FormatError(f"{path}: the two LMDB meta pages disagree on the page size")
        _, main_flags, depth, root, last, _ = m1 if m0[5] < m1[5] else m0  # liblmdb's pick
        if (last + 1) * psize > st.st_size or last < 1:
            raise fmt.FormatError(f"{path}: LMDB file is {st.st_size} bytes but its pages reach "
                                  f"{(last + 1) * psize}: the shard is truncated")
        if main_flags:
            raise fmt.FormatError(f"{path}: LMDB main database flags {main_flags:#x}: dlpack "
                                  f"shards use plain keys (damaged or not a dlpack shard)")
        w = _Walk(fd, path, psize, last)
        if root == P_INVALID:
            return 0
        if not 1 <= depth <= MAX_DEPTH:
            w.fail(None, f"tree depth {depth} outside 1..{MAX_DEPTH}")
        _walk(w, root, 1, depth)
        return w.keys
    finally:
        os.close(fd)
