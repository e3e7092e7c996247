"""Failures reach the training loop fast and clearly; nothing is left behind."""
import os
import shutil
import signal
import threading
import time

import numpy as np
import pytest

from dlpack_io.reader import (Dataset, Loader, RandomCrop, RandomResizedCrop, SampleError,
                              WorkerError)


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


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] in "ZX"
    except FileNotFoundError:
        return True


def _shm() -> set:
    """Shared-memory names torch / multiprocessing would create (ours is anonymous); other
    programs' /dev/shm entries on a shared machine are not ours to judge."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if n.startswith(("psm_", "torch_", "sem.mp-", "wnsm_", "mp-"))}


def _loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("dlpack-loader")]


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("transform_on", ["host", "device"])
def test_corrupt_record_names_shard_and_record(corrupt, kind, transform_on):
    path, shard_name, record = corrupt
    loader = Loader(Dataset(path), batch_size=8, transforms=[RandomResizedCrop(24)], num_workers=2,
                    worker_kind=kind, shuffle=None, device_transforms=(transform_on == "device"))
    start = time.monotonic()
    got = 0
    with pytest.raises(SampleError) as info:
        for _ in loader:
            got += 1
    assert time.monotonic() - start < 10
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

    real = jpegdecode.resize_region
    calls = []

    def flaky(region, box, out_size, **kw):
        calls.append(1)
        if len(calls) == 20:
            raise RuntimeError("boom in resize")
        return real(region, box, out_size, **kw)

    monkeypatch.setattr(jpegdecode, "resize_region", flaky)
    loader = Loader(Dataset(packed / "jpeg"), batch_size=8, transforms=[RandomResizedCrop(24)],
                    num_workers=2)
    with pytest.raises(SampleError, match="RuntimeError: boom in resize"):
        list(loader)
    time.sleep(0.2)
    assert not _loader_threads()


def test_killed_worker_is_reported_quickly(packed):
    loader = Loader(Dataset(packed / "jpeg"), batch_size=4, transforms=[RandomResizedCrop(24)],
                    num_workers=2, worker_kind="process", prefetch=4)
    start = None
    with pytest.raises(WorkerError, match=r"worker 1 \(pid \d+\) was killed by SIGKILL") as info:
        for k, _ in enumerate(loader):
            if k == 1:
                pids = loader.worker_pids()
                os.kill(pids[1], signal.SIGKILL)
                start = time.monotonic()
    assert time.monotonic() - start < 10
    assert "batch" in str(info.value)
    assert all(_gone(p) for p in pids)


@pytest.mark.parametrize("how", ["break", "exception", "ctrl-c"])
def test_leaving_the_loop_leaves_no_processes(packed, how):
    loader = Loader(Dataset(packed / "jpeg"), batch_size=4, transforms=[RandomResizedCrop(24)],
                    num_workers=2, worker_kind="process")
    shm_before = _shm()
    pids = []

    def consume():
        for k, _ in enumerate(loader):
            pids[:] = loader.worker_pids()
            if k == 2:
                if how == "break":
                    break
                if how == "exception":
                    raise ValueError("user code failed")
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)

    expected = {"break": None, "exception": ValueError, "ctrl-c": KeyboardInterrupt}[how]
    if expected is None:
        consume()
    else:
        with pytest.raises(expected):
            consume()
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(_gone(p) for p in pids)
    assert loader.worker_pids() == []
    assert _shm() <= shm_before


def test_threads_stop_after_break(packed):
    loader = Loader(Dataset(packed / "jpeg"), batch_size=4, transforms=[RandomResizedCrop(24)],
                    num_workers=3)
    for k, _ in enumerate(loader):
        if k == 1:
            break
    deadline = time.monotonic() + 5
    while _loader_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _loader_threads()


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
    assert seen[-1] - seen[2] < 8 * 1024, seen  # < 8 MB drift after warm-up
    assert np.isfinite(seen).all()
