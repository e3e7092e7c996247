"""tools/bench/larger_than_ram.py: its parsers and limit arithmetic, page eviction of a
mapped file, and one tiny end-to-end run (the fadvise method: no cgroup is created here)."""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os

import numpy as np
import pytest

from dlpack_io.reader import Dataset
from dlpack_io.tools.bench import larger_than_ram as ltr

PAGE = mmap.PAGESIZE


def test_parse_fields_reads_proc_io_memory_stat_and_status():
    io = "rchar: 5000\nwchar: 10\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
    assert ltr.parse_fields(io) == {"rchar": 5000, "wchar": 10, "read_bytes": 4096,
                                    "write_bytes": 0, "cancelled_write_bytes": 0}
    stat = "cache 1048576\nrss 2097152\npgmajfault 17\ntotal_cache 1048576\n"
    assert ltr.parse_fields(stat)["pgmajfault"] == 17
    assert ltr.parse_fields(stat)["cache"] == 1 << 20
    status = "Name:\tpython\nRssAnon:\t   1200 kB\nRssFile:\t     8 kB\nThreads:\t3\n"
    assert ltr.parse_fields(status) == {"RssAnon": 1200 * 1024, "RssFile": 8192, "Threads": 3}


def test_cgroup_limit_is_anon_plus_cache_page_rounded():
    mb = ltr.MB
    assert ltr.cgroup_limit(300 * mb, 256 * mb) == 556 * mb
    assert ltr.cgroup_limit(1, 0) == PAGE
    assert ltr.cgroup_limit(PAGE + 1, PAGE) == 3 * PAGE


def test_parse_block():
    assert ltr.parse_block("256x16") == (256, 16)
    assert ltr.parse_block("64X4") == (64, 4)
    with pytest.raises(argparse.ArgumentTypeError, match="expected SIZExWINDOW"):
        ltr.parse_block("256")
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 1"):
        ltr.parse_block("0x4")


def test_write_section_replaces_only_its_own_section(tmp_path):
    doc = tmp_path / "bench.md"
    doc.write_text("# Benchmarks\n\n## Loader\n\nkeep me\n")
    ltr.write_section(doc, ltr.SECTION + "\n\nfirst\n")
    assert doc.read_text() == f"# Benchmarks\n\n## Loader\n\nkeep me\n\n{ltr.SECTION}\n\nfirst\n"
    doc.write_text(doc.read_text() + "\n## Later\n\nalso kept\n")
    ltr.write_section(doc, ltr.SECTION + "\n\nsecond\n")
    assert doc.read_text() == (f"# Benchmarks\n\n## Loader\n\nkeep me\n\n{ltr.SECTION}\n\n"
                               f"second\n\n## Later\n\nalso kept\n")


def _fstype(path) -> str:
    best, kind = "", ""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ")
            mount = left.split()[4]
            if os.path.realpath(path).startswith(mount) and len(mount) > len(best):
                best, kind = mount, right.split()[0]
    return kind


def _resident_pages(addr: int, size: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    vec = (ctypes.c_ubyte * (size // PAGE))()
    if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec)


def test_unmap_and_drop_evict_pages_this_process_has_mapped(tmp_path):
    if _fstype(tmp_path) in ("tmpfs", "ramfs"):
        pytest.skip("a tmpfs file lives in the page cache: nothing to evict")
    path, size = tmp_path / "shard.rec", 64 * PAGE
    path.write_bytes(os.urandom(size))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    fd = os.open(path, os.O_RDONLY)
    addr = libc.mmap(None, ctypes.c_size_t(size), mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    try:
        ctypes.string_at(addr, size)  # fault every page in
        assert _resident_pages(addr, size) == 64
        ltr.drop_cache([path])  # fadvise alone leaves mapped pages alone
        assert _resident_pages(addr, size) > 0
        ltr.advise_mappings([path], ltr.MADV_DONTNEED)
        ltr.drop_cache([path])
        assert _resident_pages(addr, size) == 0
        assert ctypes.string_at(addr, size) == path.read_bytes()  # re-faults from the file
    finally:
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
        os.close(fd)


def test_tiny_run_end_to_end(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    res = ltr.main(["--root", str(tmp_path / "work"), "--images", "24", "--image-size", "60x80",
                    "--modes", "jpeg", "--crop", "32", "--batch", "8", "--rounds", "1",
                    "--reference", "cold", "--method", "fadvise", "--cache-mb", "1", "--block", "4x2",
                    "--json", str(tmp_path / "out.json"), "--write", str(doc)])
    assert json.loads((tmp_path / "out.json").read_text())["method"] == "fadvise"
    m = res["modes"]["jpeg"]
    ds = Dataset(tmp_path / "work/ds_jpeg")
    assert m["num_samples"] == 24 and set(m["reference"]) == {"global", "block 4x2"}
    assert set(m["runs"]) == {"global, limited", "block 4x2, limited", "global, cold",
                              "block 4x2, cold"}
    assert m["data_bytes"] == sum(f.stat().st_size for f in ltr.shard_files(tmp_path / "work/ds_jpeg"))
    for label in ("global", "block 4x2"):
        (cold,) = m["runs"][f"{label}, cold"]
        assert cold["images"] == 24 and "cg_majfault" not in m["reference"][label]["cold"]
        assert m["reference"][label]["cold"]["median_rates"] == pytest.approx(24 / cold["seconds"])
        (run,) = m["runs"][f"{label}, limited"]
        assert run["images"] == 24 and run["seconds"] > 0 and run["read_bytes"] >= 0
        assert run["peak_anon"] >= run["anon_ready"] > 0
        assert run["payload_bytes"] == int(ds.lookup(np.arange(24))[2]["length"].sum())
        s = m["limited"][label]
        assert s["median_rates"] == pytest.approx(24 / run["seconds"])
        assert s["median_read_gb"] == pytest.approx(run["read_bytes"] / 1e9)
        assert s["median_amplification"] == pytest.approx(run["read_bytes"] / run["payload_bytes"])
        assert "cg_majfault" not in s  # no cgroup, no cgroup figures
    assert m["limited"]["global"]["vs_global"] == 1.0
    assert m["quality"]["global"]["class_mix"] == pytest.approx(1.0, abs=0.1)
    assert m["quality"]["block 4x2"]["working_set"] == pytest.approx(8 * m["data_bytes"] / 24)
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\n" + ltr.SECTION)
    assert "limited by **fadvise** to 1 MB" in text and "| block 4x2 | 1 MB |" in text
    assert m["readahead_kb"] is None or m["readahead_kb"] > 0
    again = tmp_path / "again.md"
    ltr.main(["--render", str(tmp_path / "out.json"), "--write", str(again)])
    assert again.read_text() == text  # a saved run renders to the same section
