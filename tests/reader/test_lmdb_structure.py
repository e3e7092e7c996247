"""A crafted or broken LMDB shard never crashes the process (issue 13 item 6).

liblmdb trusts its pages; reader/format/checks.py walks them first. Every case opens the
shard and reads every record in a forked child: its exit status is the verdict (0: a
clean FormatError or a correct read; anything else: a crash, an abort or a hang).
"""
import os
import re
import signal
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlpack_io.reader import format as fmt
from dlpack_io.reader.format import checks
from dlpack_io.reader.shard import LmdbShard

EXAMPLES = int(os.environ.get("DLPACK_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def lmdb_shard(image_folder, tmp_path_factory):
    from dlpack_io.packer import convert

    dst = tmp_path_factory.mktemp("checks") / "ds"
    convert(image_folder, dst, format="lmdb", shard_size="1MB", workers=0, progress=False)
    return (dst / "shard-00000.lmdb").read_bytes()


def _tree(data: bytes) -> dict:
    """{pgno: "branch"|"leaf"} of the main tree of an intact file, and its meta fields."""
    psize = struct.unpack_from("<I", data, 40)[0]
    metas = [data[o:o + 152] for o in (0, psize)]
    meta = max(metas, key=lambda m: struct.unpack_from("<Q", m, 144)[0])
    root = struct.unpack_from("<Q", meta, 128)[0]
    pages, todo = {}, [root]
    while todo:
        pgno = todo.pop()
        page = data[pgno * psize:(pgno + 1) * psize]
        flags, lower = struct.unpack_from("<HH", page, 10)
        pages[pgno] = "branch" if flags == 1 else "leaf"
        if flags == 1:
            for ptr in struct.unpack_from(f"<{(lower - 16) // 2}H", page, 16):
                lo, hi, nflags = struct.unpack_from("<HHH", page, ptr)
                todo.append(lo | hi << 16 | nflags << 32)
    return {"psize": psize, "pages": pages, "root": root}


def _read_all(path: str) -> None:
    shard = LmdbShard(path)
    for j in range(len(shard.index)):
        if len(shard.payload(j)) != int(shard.index["length"][j]):
            raise AssertionError("short read")
    shard.meta()


# What a refusal of a damaged LMDB shard may say: one of checks's or LmdbShard's checks
# (a FormatError with any other text, e.g. a wrapped KeyError, fails the verdict).
KNOWN_REFUSALS = re.compile(
    r"damaged LMDB structure at|not an LMDB file|not an LMDB 0.9 file|LMDB page size|"
    r"the two LMDB meta pages disagree|LMDB file is \d+ bytes but its pages reach|"
    r"LMDB main database flags|not a readable LMDB shard|lacks its b'__meta__' or b'__index__' "
    r"key|metadata: (not valid UTF-8 JSON|expected a JSON object|JSON nested)|magic/version|"
    r"num_records .* is not the number of record keys|index checksum|index table is|"
    r"record \d+ (is missing from the LMDB shard|\(offset)")


def _verdict(path: str, deadline: float = 60.0):
    """Exit status of a forked child that opens and reads ``path`` ("hang" on timeout):
    0 for a correct read or a FormatError from a known check, 3 for any other exception,
    4 for a FormatError with an unknown message."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _read_all(path)
        except (fmt.FormatError, FileNotFoundError) as exc:
            if not KNOWN_REFUSALS.search(str(exc)):
                os.write(2, f"unknown refusal: {exc}\n".encode())
                code = 4
        except BaseException:  # an unexpected exception is a failure too
            code = 3
        os._exit(code)
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hang"


def _write(tmp_path, data: bytes) -> str:
    path = tmp_path / f"shard-{len(os.listdir(tmp_path)):05d}.lmdb"  # one LMDB open per path
    path.write_bytes(data)
    return str(path)


def _leaf_node(data: bytes, tree: dict) -> int:
    """File offset of the first node of the first leaf page."""
    pgno = min(p for p, kind in tree["pages"].items() if kind == "leaf")
    base = pgno * tree["psize"]
    return base + struct.unpack_from("<H", data, base + 16)[0]


def _first_leaf(tree: dict) -> int:
    return min(p for p, kind in tree["pages"].items() if kind == "leaf")


def _both_metas(buf, psize, fmtstr, offset, value):
    for meta in (0, psize):
        struct.pack_into(fmtstr, buf, meta + offset, value)


def _inline_value_key(data: bytes) -> int:
    """Offset of the key of a value stored in its page (not F_BIGDATA): the index or the
    metadata, whichever is small enough in this shard."""
    for key in (b"__index__", b"__meta__"):
        at = data.find(key)
        if at > 8 and struct.unpack_from("<H", data, at - 4)[0] == 0:
            return at
    raise AssertionError("no inline value in this shard: make the fixture smaller")


def _edit(data: bytes, tree: dict, case: str) -> bytes:
    buf = bytearray(data)
    psize, root = tree["psize"], tree["root"]
    node = _leaf_node(data, tree)
    leaf = _first_leaf(tree) * psize
    if case == "node-pointer-past-page":
        struct.pack_into("<H", buf, leaf + 16, psize - 2)
    elif case == "value-size-4GiB":
        struct.pack_into("<HH", buf, node, 0xFFFF, 0xFFFF)
    elif case == "inline-value-past-page":  # a small value stored in the page
        at = _inline_value_key(data)
        struct.pack_into("<HH", buf, at - 8, 0xFFFF, 0)
    elif case == "key-size-past-page":
        struct.pack_into("<H", buf, node + 6, 0xFFFF)
    elif case == "overflow-page-past-end":
        struct.pack_into("<H", buf, node + 4, 1)  # F_BIGDATA
        struct.pack_into("<Q", buf, node + 8 + struct.unpack_from("<H", buf, node + 6)[0], 2**40)
    elif case == "overflow-number-past-page":  # F_BIGDATA on a node at the page's very end
        struct.pack_into("<H", buf, node + 4, 1)
        struct.pack_into("<H", buf, node + 6, psize - (node % psize) - 8 - 4)
    elif case == "node-flags":
        struct.pack_into("<H", buf, node + 4, 2)  # F_SUBDATA
    elif case == "lower-past-page":
        struct.pack_into("<H", buf, root * psize + 12, 0xFFFE)
    elif case == "no-keys":
        struct.pack_into("<HH", buf, leaf + 12, 16, psize)
    elif case == "wrong-page-number":
        struct.pack_into("<Q", buf, leaf, 12345)
    elif case == "leaf-where-a-branch-is-expected":
        struct.pack_into("<H", buf, leaf + 10, 0x01)  # a leaf page flagged as a branch
    elif case == "root-past-last-page":
        _both_metas(buf, psize, "<Q", 128, 2**20)
    elif case == "root-is-a-meta-page":
        _both_metas(buf, psize, "<Q", 128, 0)
    elif case == "depth-zero":
        _both_metas(buf, psize, "<H", 94, 0)
    elif case == "depth-33":
        _both_metas(buf, psize, "<H", 94, 33)
    elif case == "dupsort-flags":
        _both_metas(buf, psize, "<H", 92, 0x04)
    elif case == "meta-magic":
        struct.pack_into("<I", buf, 16, 0x12345678)
    elif case == "meta-version":
        struct.pack_into("<I", buf, 20, 2)
    elif case == "page-size-1000":
        struct.pack_into("<I", buf, 40, 1000)
    elif case == "meta-page-sizes-disagree":
        struct.pack_into("<I", buf, psize + 40, psize * 2)
    elif case == "last-page-past-the-file":
        _both_metas(buf, psize, "<Q", 136, len(data) // psize + 5)
    elif case == "short-file":
        del buf[100:]
    elif case == "cycle":  # a branch page pointing at itself (a 2-level tree is needed)
        raise AssertionError("set up by _cycle")
    return bytes(buf)


# case -> the message its FormatError must carry (after the file name)
CASES = {
    "node-pointer-past-page": r"damaged LMDB structure at page \d+: node pointer \d+ outside "
                              r"the node area",
    "value-size-4GiB": r"damaged LMDB structure at page \d+: a 4294967295-byte value on overflow "
                       r"page \d+ runs past the last page \d+",
    "inline-value-past-page": r"damaged LMDB structure at page \d+: a 65535-byte value runs past "
                              r"the page",
    "key-size-past-page": r"damaged LMDB structure at page \d+: a 65535-byte key runs past the page",
    "overflow-page-past-end": r"damaged LMDB structure at page \d+: a \d+-byte value on overflow "
                              r"page 1099511627776 runs past the last page \d+",
    "overflow-number-past-page": r"damaged LMDB structure at page \d+: an overflow page number "
                                 r"runs past the page",
    "node-flags": r"damaged LMDB structure at page \d+: node flags 0x2 \(sub-databases and "
                  r"duplicates are not used by dlpack shards\)",
    "lower-past-page": r"damaged LMDB structure at page \d+: free-space bounds 65534..\d+ "
                       r"impossible in a \d+-byte page",
    "no-keys": r"damaged LMDB structure at page \d+: 0 keys \(liblmdb asserts on such a page\)",
    "wrong-page-number": r"damaged LMDB structure at page \d+: the page does not carry its own "
                         r"number",
    "leaf-where-a-branch-is-expected": r"damaged LMDB structure at page \d+: flags 0x1, expected "
                                       r"a leaf page",
    "root-past-last-page": r"damaged LMDB structure at page 1048576: page number outside 2..\d+",
    "root-is-a-meta-page": r"damaged LMDB structure at page 0: page number outside 2..\d+",
    "depth-zero": r"damaged LMDB structure at meta pages: tree depth 0 outside 1..32",
    "depth-33": r"damaged LMDB structure at meta pages: tree depth 33 outside 1..32",
    "dupsort-flags": r"LMDB main database flags 0x4: dlpack shards use plain keys",
    "meta-magic": r"not an LMDB 0.9 file \(meta page at 0: magic 0x12345678, flags 0x8, version 1\)",
    "meta-version": r"not an LMDB 0.9 file \(meta page at 0: magic 0xbeefc0de, flags 0x8, "
                    r"version 2\)",
    "page-size-1000": r"LMDB page size 1000 is not a power of two in 512..32768: damaged meta page",
    "meta-page-sizes-disagree": r"the two LMDB meta pages disagree on the page size",
    "last-page-past-the-file": r"LMDB file is \d+ bytes but its pages reach \d+: the shard is "
                               r"truncated",
    "short-file": r"not an LMDB file \(shorter than its meta pages\)",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_structure_is_a_format_error(lmdb_shard, tmp_path, case):
    path = _write(tmp_path, _edit(lmdb_shard, _tree(lmdb_shard), case))
    with pytest.raises(fmt.FormatError, match=rf"^{path}: " + CASES[case]):
        checks.check_lmdb(path)
    assert _verdict(path) == 0


@pytest.fixture(scope="module")
def deep_shard(tmp_path_factory):
    """An LMDB shard of 300 records: a two-level tree (a branch root over leaves)."""
    import lmdb

    from dlpack_io.reader import format as fmt_

    path = tmp_path_factory.mktemp("deep") / "shard-00000.lmdb"
    env = lmdb.open(str(path), subdir=False, map_size=2**26, lock=False, meminit=True)
    with env.begin(write=True) as txn:
        for i in range(300):
            txn.put(fmt_.lmdb_record_key(i), bytes(40))
    env.close()
    data = path.read_bytes()
    assert _tree(data)["pages"][_tree(data)["root"]] == "branch"
    return data


@pytest.mark.parametrize("case", ["cycle", "shared-subtree", "one-key-branch"])
def test_damaged_branch_pages(deep_shard, tmp_path, case):
    tree = _tree(deep_shard)
    psize, root = tree["psize"], tree["root"]
    buf = bytearray(deep_shard)
    base = root * psize
    lower = struct.unpack_from("<H", buf, base + 12)[0]
    ptrs = struct.unpack_from(f"<{(lower - 16) // 2}H", buf, base + 16)
    if case == "cycle":  # the root's last child is the root itself
        struct.pack_into("<HH", buf, base + ptrs[-1], root & 0xFFFF, root >> 16)
        match = rf"damaged LMDB structure at page {root}: page reached twice"
    elif case == "shared-subtree":  # two children are one page
        lo, hi = struct.unpack_from("<HH", buf, base + ptrs[0])
        struct.pack_into("<HH", buf, base + ptrs[1], lo, hi)
        match = r"damaged LMDB structure at page \d+: page reached twice \(a cycle or a shared subtree\)"
    else:
        struct.pack_into("<H", buf, base + 12, 16 + 2)
        match = rf"damaged LMDB structure at page {root}: 1 keys \(liblmdb asserts on such a page\)"
    path = _write(tmp_path, bytes(buf))
    with pytest.raises(fmt.FormatError, match=match):
        checks.check_lmdb(path)
    assert _verdict(path) == 0


def test_intact_shard_passes_and_counts_its_keys(lmdb_shard, tmp_path):
    path = _write(tmp_path, lmdb_shard)
    assert checks.check_lmdb(path) == 24 + 2  # the records, __index__ and __meta__
    _read_all(path)


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 2**20), st.sampled_from(["byte", "u16", "u64"]),
                                st.integers(0, 2**64 - 1)), min_size=1, max_size=4),
       target=st.sampled_from(["tree", "meta", "anywhere"]))
def test_fuzz_lmdb_pages_never_crash(lmdb_shard, tmp_path, edits, target):
    """Random bytes, u16 and u64 written into the tree pages, the meta pages or anywhere;
    the process that opens and reads the shard must end cleanly."""
    tree = _tree(lmdb_shard)
    psize, buf = tree["psize"], bytearray(lmdb_shard)
    pages = sorted(tree["pages"]) if target == "tree" else [0, 1] if target == "meta" else None
    for where, kind, value in edits:
        at = (pages[where % len(pages)] * psize + (where >> 4) % psize) if pages else where % len(buf)
        size = {"byte": 1, "u16": 2, "u64": 8}[kind]
        at = min(at, len(buf) - size)
        buf[at:at + size] = (value % 256 ** size).to_bytes(size, "little")
    assert _verdict(_write(tmp_path, bytes(buf))) == 0
