"""A growing shard (reader/remote/growing.py) in a cache folder that cannot be trusted:
files replaced, hard-linked, truncated or resized behind the reader's back. Every byte
served is one this process verified; nothing outside the cache is written. Real SeaweedFS."""
from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from dlpack_io.reader import Loader, Output, RandomResizedCrop, Workers
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.shard import ShardChangedError

from helpers import batches_equal, pack_and_upload

URL = "s3://dlpack-test/growing/untrusted"


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    return pack_and_upload(tmp_path_factory.mktemp("untrusted"), URL, s3_server.env(),
                           count=20, classes=2, seed=7, size=(40, 48))


def _remote(cache):
    """The data set in the bucket, its records fetched range by range (growing in place)."""
    return Dataset(URL, cache_dir=cache, fetch_mode="records")


def _epoch(ds, kind="thread"):
    loader = Loader(ds, batch_size=4, seed=1, transforms=[RandomResizedCrop(16)],
                    output=Output(return_index=True), workers=Workers(kind=kind), num_workers=2)
    out = [(idx.copy(), images.clone(), labels.clone()) for images, labels, idx in loader]
    loader.close()
    return out


def _first_batch(ds, k=0):
    """Land the first 3 records of shard ``k`` in its growing file (the planner's way)."""
    first = ds._remote.first_sample(k)
    prefetch = ds.start_prefetch([np.arange(first, first + 3)], mode="records")
    prefetch.wait(0)
    return prefetch


def test_a_growing_file_replaced_before_it_is_published_is_not_stamped(s3_env, packed,
                                                                       tmp_path):
    """Between the last record's check and the link to <k>.shard, the .grow path is swapped
    for another file of the right size (zeros: a new inode). The file published and stamped
    as verified must be the one this process verified, never the swapped-in one (a stamp
    lets every later process map it without a check). The next run joins the file it
    finds, checks it, and fills it."""
    remote = _remote(tmp_path / "cache")
    whole, grow = remote._remote.whole, remote._remote.growing
    real = whole.adopt

    def swapped(k, *args):
        forged = tmp_path / f"forged{k}"
        with open(forged, "wb") as f:
            f.truncate(remote.shards[k].size)
        os.replace(forged, grow.path(k))
        return real(k, *args)
    whole.adopt = swapped
    local = Dataset(packed)
    batches_equal(_epoch(local), _epoch(remote))
    assert not os.path.exists(whole.path(0))  # ours lost its name: nothing to publish
    again = _remote(tmp_path / "cache")
    batches_equal(_epoch(local), _epoch(again))
    with open(os.path.join(again._remote.keeper.dir, ".ledger"), "rb") as f:
        assert int(f.read()) == sum(s.size for s in again.shards)  # each counted once


def _records_dir(remote) -> str:
    os.makedirs(remote._remote.keeper.dir, mode=0o700, exist_ok=True)
    return remote._remote.keeper.dir


def test_hard_links_to_files_outside_are_never_written(s3_env, packed, tmp_path):
    """<0>.grow and <1>.grow.map are hard links to files of ours outside the cache (the
    growing file with the shard's exact size): neither is written, truncated or removed."""
    remote = _remote(tmp_path / "cache")
    folder, grow = _records_dir(remote), remote._remote.growing
    victims = {grow.path(0): tmp_path / "victim0", grow.path(1) + ".map": tmp_path / "victim1"}
    victims[grow.path(0)].write_bytes(b"v" * remote.shards[0].size)
    victims[grow.path(1) + ".map"].write_bytes(b"keep me")
    for name, victim in victims.items():
        os.link(victim, name)
    batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    assert victims[grow.path(0)].read_bytes() == b"v" * remote.shards[0].size
    assert victims[grow.path(1) + ".map"].read_bytes() == b"keep me"
    assert os.path.isdir(folder)


@pytest.mark.parametrize("extra", [-3, 100])
def test_a_map_of_the_wrong_length_is_repaired_for_every_process(s3_env, packed, tmp_path,
                                                                 extra):
    """A map left shorter or longer than one byte per record (a bad earlier run, a local
    edit): process workers read the same verified bytes as the main process."""
    remote = _remote(tmp_path / "cache")
    first = _remote(tmp_path / "cache")
    _first_batch(first).close()  # shard 0 growing, three records marked present
    path = first._remote.growing.path(0) + ".map"
    n = len(first.shards[0].index)
    with open(path, "r+b") as f:
        f.truncate(n + extra)
    batches_equal(_epoch(Dataset(packed), "process"), _epoch(remote, "process"))


def _in_child(fn) -> bytes:
    """``fn()``'s bytes, computed in a forked child (as a process worker would)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.write(write, fn())
        finally:
            os._exit(0)
    os.close(write)
    out = b"".join(iter(lambda: os.read(read, 1 << 16), b""))
    os.close(read)
    os.waitpid(pid, 0)
    return out


def test_a_worker_joins_a_growing_file_whose_map_was_longer(s3_env, packed, tmp_path):
    first = _remote(tmp_path / "cache")
    _first_batch(first).close()  # shard 0 growing, records 0-2 marked present
    path = first._remote.growing.path(0) + ".map"
    with open(path, "ab") as f:
        f.write(b"\x01" * 100)
    remote = _remote(tmp_path / "cache")
    grow = remote._remote.growing
    assert grow.start(0, 1 << 30)  # the owner (its planner) joins the file
    got = _in_child(lambda: bytes(grow.record(0, 1) or b"none"))
    assert got == bytes(remote.shards[0].payload(1)) + bytes(remote.shards[0].fields_block(1))


def _child(cache, action) -> subprocess.CompletedProcess:
    script = os.path.join(os.path.dirname(__file__), "grow_child.py")
    return subprocess.run([sys.executable, script, URL, str(cache), action],
                          capture_output=True, text=True, timeout=120)


def test_a_growing_file_cut_while_mapped_is_an_error_naming_it(s3_env, packed, tmp_path):
    """Another process's record is checked after the file was cut to one page under the
    map: an error naming the file, not a SIGBUS."""
    _first_batch(_remote(tmp_path / "cache")).close()  # records 0-2 written by this process
    done = _child(tmp_path / "cache", "cut")
    assert done.returncode == 0, done.stderr
    path = _remote(tmp_path / "cache")._remote.growing.path(0)
    assert done.stdout.startswith("ShardChangedError") and path in done.stdout


def test_a_writer_killed_mid_record_never_serves_half_a_record(s3_env, packed, tmp_path):
    """SIGKILL in the middle of a record's write: the next run checks, refetches, finishes
    every shard and counts each once on the ledger."""
    done = _child(tmp_path / "cache", "kill")
    assert done.returncode == -signal.SIGKILL, done.stderr
    remote = _remote(tmp_path / "cache")
    assert os.path.exists(remote._remote.growing.path(0))  # left half full
    batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    folder = remote._remote.keeper.dir
    assert sorted(n for n in os.listdir(folder) if n.endswith((".shard", ".grow", ".map"))) \
        == ["0.shard", "1.shard"]
    with open(os.path.join(folder, ".ledger"), "rb") as f:
        assert int(f.read()) == sum(s.size for s in remote.shards)


def test_a_full_disk_while_records_land_names_the_file_and_reading_goes_on(
        s3_env, packed, tmp_path, monkeypatch, caplog):
    """A growing file that cannot take its records (a file system that reserved nothing):
    a warning names it and the fix, and the records land one file each (streamed)."""
    from dlpack_io.reader.remote import cache as cache_mod

    remote = _remote(tmp_path / "cache")
    real, head = cache_mod.pwrite_all, remote.shards[0].header

    def full(fd, data, at):
        if head.data_offset <= at < head.index_offset:  # a record, not the header
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data, at)
    monkeypatch.setattr(cache_mod, "pwrite_all", full)
    with caplog.at_level("WARNING"):
        batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    assert "No space left on device" in caplog.text and "cache_limit" in caplog.text
    assert re.search(r"records/[01]\.grow; free space there.*; records land one file each",
                     caplog.text)


def test_a_disk_too_full_to_reserve_a_growing_file_keeps_records_one_file_each(
        s3_env, packed, tmp_path, monkeypatch, caplog):
    """posix_fallocate's ENOSPC when a growing file is made: that shard's records are kept
    one file each (a warning names the file; assembled from them once all are in), no
    .grow, map or temporary file left, the epoch as the local one."""
    def full(fd, at, size):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "posix_fallocate", full)
    remote = _remote(tmp_path / "cache")
    batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    folder = remote._remote.keeper.dir
    assert not [n for n in os.listdir(folder) if n.endswith((".grow", ".map"))
                or n.startswith(".tmp-")]
    assert re.search(r"records/0\.grow: .*No space left on device; records of shard 0 are "
                     r"kept one file each", caplog.text)


def test_an_assembled_shard_cut_while_it_is_checked_is_discarded(s3_env, packed, tmp_path):
    """Another process checks assembled shard 0 record by record before it uses it; cut
    to one page meanwhile, it is discarded (and fetched again later), never a SIGBUS."""
    remote = _remote(tmp_path / "cache")
    batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    done = _child(tmp_path / "cache", "cutshard")
    assert (done.returncode, done.stdout) == (0, "discarded\n"), done.stderr
    assert not os.path.exists(remote._remote.whole.path(0))


def test_a_growing_file_cut_under_its_writer_is_an_error_naming_it(s3_env, packed, tmp_path):
    """Cut to one page after records 0-2 landed: the next landing would extend it again
    (zeros where verified records were); the planner refuses to write into it."""
    remote = _remote(tmp_path / "cache")
    prefetch = _first_batch(remote)
    os.truncate(remote._remote.growing.path(0), 4096)
    first = remote._remote.first_sample(0)
    prefetch.close()
    prefetch = remote.start_prefetch([np.arange(first + 3, first + 6)], mode="records")
    with pytest.raises(ShardChangedError) as caught:  # rewrapped by the planner: same class
        prefetch.wait(0)
    prefetch.close()
    path = remote._remote.growing.path(0)
    assert "changed on disk" in str(caught.value) and path in str(caught.value)
    assert os.path.getsize(path) == 4096  # nothing written into it


def test_only_the_planner_clears_a_mark_of_the_map(s3_env, packed, tmp_path):
    """A worker process that finds a marked record damaged leaves the map alone: a worker
    that read the bytes just before the planner rewrote them would otherwise clear the
    planner's fresh mark, and every worker would fail on that record until the shard is
    finished. The planner, which fetches it again, clears it."""
    first = _remote(tmp_path / "cache")
    _first_batch(first).close()
    grow = first._remote.growing
    at = int(first.shards[0].index[1]["offset"])
    with open(grow.path(0), "r+b") as f:  # record 1: damaged, still marked
        f.seek(at)
        f.write(b"\x00")
    remote = _remote(tmp_path / "cache")
    grow = remote._remote.growing
    assert grow.start(0, 1 << 30)
    assert _in_child(lambda: b"none" if grow.record(0, 1) is None else b"served") == b"none"
    with open(grow.path(0) + ".map", "rb") as f:
        assert f.read()[1] == 1  # left for the planner
    assert grow.record(0, 1) is None
    with open(grow.path(0) + ".map", "rb") as f:
        assert f.read()[1] == 0


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_map_that_is_not_a_regular_file_is_never_waited_on_or_followed(s3_env, packed,
                                                                         tmp_path, kind):
    remote = _remote(tmp_path / "cache")
    path = os.path.join(_records_dir(remote), "0.grow.map")
    target = tmp_path / "victim"
    target.write_bytes(b"keep me")
    os.mkfifo(path) if kind == "fifo" else os.symlink(target, path)
    batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    assert target.read_bytes() == b"keep me"
    assert os.path.exists(remote._remote.whole.path(0))  # kept record by record, assembled
    assert not os.path.exists(remote._remote.growing.path(0))  # no file of ours left behind
    with open(os.path.join(remote._remote.keeper.dir, ".ledger"), "rb") as f:
        assert int(f.read()) == sum(s.size for s in remote.shards)  # each counted once


def _ledger(remote) -> int:
    with open(os.path.join(remote._remote.keeper.dir, ".ledger"), "rb") as f:
        return int(f.read())


@pytest.mark.parametrize("planted", ["grow", "record"])
def test_files_planted_in_advance_go_on_the_ledger(s3_env, packed, tmp_path, planted):
    """A <0>.grow of the right size (zeros) or a kept record file with the right bytes,
    put in the records folder while the ledger says 0: joined or used once verified, and
    counted, so cache_limit holds (each shard once on the ledger in the end)."""
    remote = _remote(tmp_path / "cache")
    folder = _records_dir(remote)
    with open(os.path.join(folder, ".ledger"), "wb") as f:
        f.write(b"0" * 20)
    if planted == "grow":
        with open(remote._remote.growing.path(0), "wb") as f:
            f.truncate(remote.shards[0].size)
    else:
        local = Dataset(packed)
        os.makedirs(os.path.join(folder, "1"), mode=0o700)
        with open(remote._remote.keeper.path(1, 0), "wb") as f:
            f.write(bytes(local.shards[1].payload(0)) + bytes(local.shards[1].fields_block(0)))
    batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    assert _ledger(remote) == sum(s.size for s in remote.shards)


def test_a_growing_file_that_cannot_be_mapped_leaks_nothing(s3_env, packed, tmp_path,
                                                            monkeypatch):
    """mmap() itself fails (no address space): both descriptors are closed, the file and
    map this process had just made are removed and off the ledger, and records are kept
    one file each."""
    import mmap as mmap_mod

    from dlpack_io.reader.remote import cache as cache_mod

    remote = _remote(tmp_path / "cache")
    grow = remote._remote.growing

    class NoMap:
        PROT_READ = mmap_mod.PROT_READ

        def mmap(self, *args, **kwargs):
            raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
    monkeypatch.setattr(cache_mod, "mmap", NoMap())
    before = sorted(os.listdir("/proc/self/fd"))
    assert not grow.start(0, 1 << 30) and not grow.start(1, 1 << 30)
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert not os.path.lexists(grow.path(0)) and not os.path.lexists(grow.path(0) + ".map")
    assert _ledger(remote) == 0
    monkeypatch.undo()
    batches_equal(_epoch(Dataset(packed)), _epoch(remote))  # record by record, assembled
    assert _ledger(remote) == sum(s.size for s in remote.shards)
