"""A crafted or broken LMDB shard never crashes the process (issue 13 item 6).

liblmdb trusts its pages; reader/lmdbcheck.py walks them first. Every case opens the
shard and reads every record in a forked child: its exit status is the verdict (0: a
clean FormatError or a correct read; anything else: a crash, an abort or a hang).
"""
import os
import signal
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlpack_io.reader import format as fmt
from dlpack_io.reader import lmdbcheck
from dlpack_io.reader.shard import LmdbShard

EXAMPLES = int(os.environ.get("DLPACK_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def lmdb_shard(image_folder, tmp_path_factory):
    from dlpack_io.packer import convert

    dst = tmp_path_factory.mktemp("lmdbcheck") / "ds"
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


def _verdict(path: str, deadline: float = 30.0):
    """Exit status of a forked child that opens and reads ``path`` ("hang" on timeout)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _read_all(path)
        except (fmt.FormatError, FileNotFoundError):
            pass
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


def _edit(data: bytes, tree: dict, case: str) -> bytes:
    buf = bytearray(data)
    psize, root = tree["psize"], tree["root"]
    node = _leaf_node(data, tree)
    if case == "node-pointer-past-page":
        leaf = node - node % psize
        struct.pack_into("<H", buf, leaf + 16, psize - 2)
    elif case == "value-size-4GiB":
        struct.pack_into("<HH", buf, node, 0xFFFF, 0xFFFF)
    elif case == "key-size-past-page":
        struct.pack_into("<H", buf, node + 6, 0xFFFF)
    elif case == "overflow-page-past-end":
        struct.pack_into("<H", buf, node + 4, 1)  # F_BIGDATA
        struct.pack_into("<Q", buf, node + 8 + struct.unpack_from("<H", buf, node + 6)[0], 2**40)
    elif case == "lower-past-page":
        struct.pack_into("<H", buf, root * psize + 12, 0xFFFE)
    elif case == "root-past-last-page":
        for meta in (0, psize):
            struct.pack_into("<Q", buf, meta + 128, 2**20)
    elif case == "root-is-a-meta-page":
        for meta in (0, psize):
            struct.pack_into("<Q", buf, meta + 128, 0)
    elif case == "depth-zero":
        for meta in (0, psize):
            struct.pack_into("<H", buf, meta + 94, 0)
    elif case == "dupsort-flags":
        for meta in (0, psize):
            struct.pack_into("<H", buf, meta + 92, 0x04)
    return bytes(buf)


CASES = ["node-pointer-past-page", "value-size-4GiB", "key-size-past-page",
         "overflow-page-past-end", "lower-past-page", "root-past-last-page",
         "root-is-a-meta-page", "depth-zero", "dupsort-flags"]


@pytest.mark.parametrize("case", CASES)
def test_damaged_structure_is_a_format_error(lmdb_shard, tmp_path, case):
    path = _write(tmp_path, _edit(lmdb_shard, _tree(lmdb_shard), case))
    with pytest.raises(fmt.FormatError, match="shard-0000"):
        lmdbcheck.check_lmdb(path)
    assert _verdict(path) == 0


def test_intact_shard_passes_and_counts_its_keys(lmdb_shard, tmp_path):
    path = _write(tmp_path, lmdb_shard)
    assert lmdbcheck.check_lmdb(path) == 24 + 2  # the records, __index__ and __meta__
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
