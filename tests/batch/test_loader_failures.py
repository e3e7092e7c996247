"""Failures reach the training loop clearly; nothing is left behind.

"Fast" is not measured here (a loaded machine makes any time bound flaky): every test runs
under the 60 s hang guard, and waits for events (an exception, a process gone) with
generous deadlines that only guard against a hang.
"""
import os
import shutil
import signal
import threading
import time

import pytest

from dlpack_io.reader import (Dataset, Loader, RandomCrop, RandomResizedCrop, SampleError,
                              WorkerError, Workers)

from helpers import gone, shared_memory_of, wait_until


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("failures")
    make_image_folder(root / "src", 64, 4, seed=3, size=(48, 64))
    convert(root / "src", root / "jpeg", mode="jpeg", shard_size="60KB", workers=1,
            progress=False, overwrite=True)
    return root


@pytest.fixture
def corrupt(packed, tmp_path):
    """A copy of the data set whose sample 37 is garbage (CRC left stale)."""
    dst = tmp_path / "corrupt"
    shutil.copytree(packed / "jpeg", dst)
    ds = Dataset(dst)
    shard, record = ds.locate(37)
    _, entry = ds.record(37)
    with open(ds.shards[shard].path, "r+b") as f:
        f.seek(int(entry["offset"]))
        f.write(b"\0" * 32)
    return dst, os.path.basename(ds.shards[shard].path), record


pytestmark = pytest.mark.usefixtures("hang_deadline")


def _loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("dlpack-loader")]


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("transform_on", ["host", "device"])
def test_corrupt_record_names_shard_and_record(corrupt, kind, transform_on):
    path, shard_name, record = corrupt
    loader = Loader(Dataset(path), batch_size=8, transforms=[RandomResizedCrop(24)], num_workers=2,
                    workers=Workers(kind=kind, device_transforms=transform_on == "device"),
                    shuffle=None)
    got = 0
    with pytest.raises(SampleError, match=rf"{shard_name} record {record} \(sample 37\)") as info:
        for _ in loader:
            got += 1
    assert got == 37 // 8  # every batch before the bad one arrived
    message = str(info.value)
    assert shard_name in message and f"record {record}" in message and "sample 37" in message
    assert "JPEG" in message
    assert info.value.sample == 37


def test_transform_error_names_the_sample(packed):
    loader = Loader(Dataset(packed / "jpeg"), batch_size=8, transforms=[RandomCrop(1000)], num_workers=2)
    with pytest.raises(SampleError, match=r"shard-\d+\.rec record \d+ \(sample \d+\).*only"):
        next(iter(loader))


def test_exception_inside_a_transform_reaches_the_loop(packed, monkeypatch):
    from dlpack_io.reader import jpegdecode

    real = jpegdecode.decode_resized  # decode + resize of one sample (one C call)
    calls = []
    # samples one at a time (the many-record C call takes the common case: test_decode_at_once)
    monkeypatch.setattr(jpegdecode, "native_decode_resized_many", None)

    def flaky(*args, **kw):
        calls.append(1)
        if len(calls) == 20:
            raise RuntimeError("boom in resize")
        return real(*args, **kw)

    monkeypatch.setattr(jpegdecode, "decode_resized", flaky)
    loader = Loader(Dataset(packed / "jpeg"), batch_size=8, transforms=[RandomResizedCrop(24)],
                    num_workers=2)
    with pytest.raises(SampleError, match="RuntimeError: boom in resize"):
        list(loader)
    wait_until(lambda: not _loader_threads(), what="the loader threads' exit")


def test_killed_worker_is_reported_quickly(packed):
    loader = Loader(Dataset(packed / "jpeg"), batch_size=4, transforms=[RandomResizedCrop(24)],
                    num_workers=2, workers=Workers(kind="process", prefetch=4))
    pids = []
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) was killed by SIGKILL while "
                                          r"building batch \d+"):
        for k, _ in enumerate(loader):
            if k == 1:
                pids = loader.worker_pids()
                os.kill(pids[1], signal.SIGKILL)
    assert len(pids) == 2
    wait_until(lambda: all(gone(p) for p in pids), what="the workers' exit")


@pytest.mark.parametrize("how", ["break", "exception", "ctrl-c"])
def test_leaving_the_loop_leaves_no_processes(packed, how):
    loader = Loader(Dataset(packed / "jpeg"), batch_size=4, transforms=[RandomResizedCrop(24)],
                    num_workers=2, workers=Workers(kind="process"))
    pids, shm_while_running = [], []

    def consume():
        for k, _ in enumerate(loader):
            pids[:] = loader.worker_pids()
            if k == 2:
                shm_while_running[:] = shared_memory_of([os.getpid(), *pids])
                if how == "break":
                    break
                if how == "exception":
                    raise ValueError("user code failed")
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(60)  # interrupted at once by the KeyboardInterrupt; a hang guard

    if how == "break":
        consume()
    else:
        expected, match = {"exception": (ValueError, "user code failed"),
                           "ctrl-c": (KeyboardInterrupt, "^$")}[how]  # Ctrl-C: no message
        with pytest.raises(expected, match=match):
            consume()
    assert len(pids) == 2 and all(p != os.getpid() for p in pids)
    assert shm_while_running == []  # the slots are anonymous mappings, nothing in /dev/shm
    wait_until(lambda: all(gone(p) for p in pids), what="the workers' exit")
    assert loader.worker_pids() == []
    assert shared_memory_of([os.getpid()]) == []


def test_threads_stop_after_break(packed):
    loader = Loader(Dataset(packed / "jpeg"), batch_size=4, transforms=[RandomResizedCrop(24)],
                    num_workers=3)
    for k, _ in enumerate(loader):
        if k == 1:
            assert len(_loader_threads()) == 3  # what the check below would miss otherwise
            break
    wait_until(lambda: not _loader_threads(), what="the loader threads' exit")


def test_memory_is_flat_across_epochs(packed):
    def rss_kb():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))

    loader = Loader(Dataset(packed / "jpeg"), batch_size=8, transforms=[RandomResizedCrop(64)],
                    num_workers=2)
    seen = []
    for epoch in range(8):
        loader.set_epoch(epoch)
        for images, labels in loader:
            pass
        seen.append(rss_kb())
    assert min(seen) > 10 * 1024, seen  # a real reading (a torch process is > 10 MB)
    assert seen[-1] - seen[2] < 8 * 1024, seen  # < 8 MB drift after warm-up
