"""benchmarks/larger_than_ram: its parsers and limit arithmetic, page eviction of a mapped
file, and one tiny end-to-end run (the fadvise method: no cgroup is created here)."""
from __future__ import annotations

import ctypes
import json
import mmap
import os

import numpy as np
import pytest
import torch

from benchmarks.larger_than_ram import cache, cgroup, loader, main, measure, report
from dlpack_io.reader import Dataset

PAGE = mmap.PAGESIZE


def test_parse_fields_reads_proc_io_memory_stat_and_status():
    io = "rchar: 5000\nwchar: 10\nread_bytes: 4096\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
    assert cache.parse_fields(io) == {"rchar": 5000, "wchar": 10, "read_bytes": 4096,
                                    "write_bytes": 0, "cancelled_write_bytes": 0}
    stat = "cache 1048576\nrss 2097152\npgmajfault 17\ntotal_cache 1048576\n"
    assert cache.parse_fields(stat)["pgmajfault"] == 17
    assert cache.parse_fields(stat)["cache"] == 1 << 20
    status = "Name:\tpython\nRssAnon:\t   1200 kB\nRssFile:\t     8 kB\nThreads:\t3\n"
    assert cache.parse_fields(status) == {"RssAnon": 1200 * 1024, "RssFile": 8192, "Threads": 3}


def test_cgroup_limit_is_anon_plus_cache_page_rounded():
    mb = cache.MB
    assert cgroup.cgroup_limit(300 * mb, 256 * mb) == 556 * mb
    assert cgroup.cgroup_limit(1, 0) == PAGE
    assert cgroup.cgroup_limit(PAGE + 1, PAGE) == 3 * PAGE


def test_contenders_come_from_the_registry_with_global_always_in():
    from dlpack_io.tools.bench import families

    ram = families.BY_SECTION["ram"]
    assert measure.contenders() == ram and list(ram)[0] == "global"
    assert list(measure.contenders("block-256x4")) == ["global", "block-256x4"]
    assert loader.geometry(ram["global"]) == (256, 16)  # the Loader's defaults
    assert loader.geometry(ram["block-256x4"]) == (256, 4)
    with pytest.raises(ValueError, match=r"unknown contender\(s\) \['nope'\]"):
        measure.contenders("global,nope")
    with pytest.raises(SystemExit, match="unknown contender"):  # before any data is made
        main.main(["--root", "/nonexistent/never-made", "--only", "block-9x9"])


def _rand_read_flags(files) -> list:
    """For each mapping of ``files`` in this process: whether VmFlags has rr (MADV_RANDOM)."""
    names, out, current = {os.path.realpath(f) for f in files}, [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if "-" in head[0] and not head[0].endswith(":"):
                current = len(head) == 6 and head[5].strip() in names
            elif head[0] == "VmFlags:" and current:
                out.append("rr" in line.split()[1:])
    return out


def test_ram_loader_builds_the_family_loader_and_advises_its_mappings(image_folder, tmp_path):
    from dlpack_io.packer import convert
    from dlpack_io.tools.bench import families

    convert(image_folder, tmp_path / "ds", shard_size="20KB", progress=False)
    files = cache.shard_files(tmp_path / "ds")
    ram = families.BY_SECTION["ram"]
    block = families.build(ram["block-256x4"], tmp_path / "ds", "jpeg", 16, 4, 0)
    o = block.options
    assert (o.shuffle, o.order.block_size, o.order.block_window, o.batch_size) == ("block", 256, 4, 4)
    assert _rand_read_flags(files) and not any(_rand_read_flags(files))  # mapped, default
    plain = families.build(ram["global"], tmp_path / "ds", "jpeg", 16, 4, 0)
    assert plain.options.shuffle == "global" and not any(_rand_read_flags(files))
    seen = [(images.shape, images.dtype, idx) for images, _, idx in plain]
    assert all(shape == (4, 3, 16, 16) and dtype == torch.uint8 for shape, dtype, _ in seen)
    assert sorted(np.concatenate([i for *_, i in seen]).tolist()) == list(range(24))
    assert len(files) > 1  # several shards, each mapped
    families.build(ram["global-madv-random"], tmp_path / "ds", "jpeg", 16, 4, 0)
    assert all(_rand_read_flags(files))  # every mapping of the shards in this process
    with pytest.raises(ValueError, match=r"advice='sequential': expected one of"):
        loader.ram_loader(tmp_path / "ds", "jpeg", 16, 4, 0, shuffle="global", advice="sequential")


def test_write_section_replaces_only_its_own_section(tmp_path):
    doc = tmp_path / "bench.md"
    doc.write_text("# Benchmarks\n\n## Loader\n\nkeep me\n")
    report.write_section(doc, report.SECTION + "\n\nfirst\n")
    assert doc.read_text() == f"# Benchmarks\n\n## Loader\n\nkeep me\n\n{report.SECTION}\n\nfirst\n"
    doc.write_text(doc.read_text() + "\n## Later\n\nalso kept\n")
    report.write_section(doc, report.SECTION + "\n\nsecond\n")
    assert doc.read_text() == (f"# Benchmarks\n\n## Loader\n\nkeep me\n\n{report.SECTION}\n\n"
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
        cache.drop_cache([path])  # fadvise alone leaves mapped pages alone
        assert _resident_pages(addr, size) > 0
        cache.advise_mappings([path], cache.MADV_DONTNEED)
        cache.drop_cache([path])
        assert _resident_pages(addr, size) == 0
        assert ctypes.string_at(addr, size) == path.read_bytes()  # re-faults from the file
    finally:
        libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size))
        os.close(fd)


def test_tiny_run_end_to_end(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    res = main.main(["--root", str(tmp_path / "work"), "--images", "24", "--image-size", "60x80",
                    "--modes", "jpeg", "--crop", "32", "--batch", "8", "--rounds", "1",
                    "--reference", "cold", "--method", "fadvise", "--cache-mb", "1",
                    "--only", "block-256x4",
                    "--json", str(tmp_path / "out.json"), "--write", str(doc)])
    assert json.loads((tmp_path / "out.json").read_text())["method"] == "fadvise"
    m = res["modes"]["jpeg"]
    ds = Dataset(tmp_path / "work/ds_jpeg")
    assert m["num_samples"] == 24 and set(m["reference"]) == {"global", "block-256x4"}
    assert set(m["runs"]) == {"global, limited", "block-256x4, limited", "global, cold",
                              "block-256x4, cold"}
    assert m["labels"] == {"global": "global", "block-256x4": "block 256x4"}
    assert m["data_bytes"] == sum(f.stat().st_size for f in cache.shard_files(tmp_path / "work/ds_jpeg"))
    for label in ("global", "block-256x4"):
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
    assert m["quality"]["block-256x4"]["working_set"] == pytest.approx(1024 * m["data_bytes"] / 24)
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\n" + report.SECTION)
    assert "limited by **fadvise** to 1 MB" in text and "| block 256x4 | 1 MB |" in text
    assert m["readahead_kb"] is None or m["readahead_kb"] > 0
    again = tmp_path / "again.md"
    main.main(["--render", str(tmp_path / "out.json"), "--write", str(again)])
    assert again.read_text() == text  # a saved run renders to the same section
