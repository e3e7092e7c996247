"""Check the structure of an LMDB shard before liblmdb sees it.

liblmdb trusts its file: a crafted page (a node pointer past the page, a data size past the
file, a branch page with one key) makes it read outside its map or abort. So before a shard
is opened we read its meta pages and walk its B-tree ourselves with ``os.pread`` (which
cannot fault), checking every page and node liblmdb's lookups would touch. A file that
passes can only make liblmdb read inside the file: wrong bytes at worst, which the record
CRCs catch. Layout of LMDB 0.9 (64-bit), as py-lmdb bundles it:

  page header (16 B): pgno u64 @0, pad u16 @8, flags u16 @10, lower u16 @12, upper u16 @14
                      (overflow pages: page count u32 @12); node pointers u16[] from @16
  meta (pages 0, 1):  magic u32 @16, version u32 @20, dbs[FREE] @40, dbs[MAIN] @88
                      (db: pad u32 (FREE: page size) +0, flags u16 +4, depth u16 +6,
                      branch/leaf/overflow pages, entries u64 +8/+16/+24/+32, root u64 +40),
                      last page u64 @136, txn id u64 @144; liblmdb reads the meta with the
                      larger txn id
  node (8 B + key + data): lo u16, hi u16, flags u16, key size u16; branch: child page
                      lo | hi << 16 | flags << 32; leaf: data size lo | hi << 16, flag
                      F_BIGDATA (1): data is the u64 number of its first overflow page
"""
from __future__ import annotations

import os
import struct

from dlpack_io.reader.format import spec as fmt
from dlpack_io.reader.format.regular import open_regular

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
