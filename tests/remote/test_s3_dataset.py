"""Dataset("s3://...") and its prefetch planner against a real SeaweedFS server."""
from __future__ import annotations

import gc
import os
import pickle
import threading

import numpy as np
import pytest

from dlpack_io.packer import convert
from dlpack_io.reader import format as fmt
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.remote.storage import EndpointUnreachableError, StorageError, Store
from dlpack_io.tools.synth import make_image_folder

from helpers import upload_folder

BUCKET = "dlpack-test"
URL = f"s3://{BUCKET}/dataset/base"


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    """(local data set folder, its URL): 48 JPEGs in 4+ shards, uploaded once per module."""
    root = tmp_path_factory.mktemp("s3ds")
    make_image_folder(root / "src", 48, 3, seed=5, size=(48, 64))
    convert(root / "src", root / "local", shard_size="40KB", workers=1, progress=False)
    upload_folder(root / "local", URL, s3_server.env())
    return str(root / "local"), URL


def _batches(n, size, seed=0):
    order = np.random.default_rng(seed).permutation(n)
    return [order[i:i + size] for i in range(0, n - size + 1, size)]


def _same(local, remote, indices):
    for i in indices:
        a, la = local[int(i)]
        b, lb = remote[int(i)]
        assert la == lb and np.array_equal(a, b), f"sample {i} differs"


def test_remote_samples_equal_local_ones(s3_env, packed):
    local, remote = Dataset(packed[0]), Dataset(packed[1])
    assert len(remote) == len(local) == 48 and remote.classes == local.classes
    assert len(remote.shards) >= 4
    _same(local, remote, range(48))   # on demand: one range request each
    assert local.start_prefetch([np.arange(4)]) is None
    prefetch = remote.start_prefetch([np.arange(48)], mode="records")
    prefetch.wait(0, timeout=60)
    secret = os.environ["AWS_SECRET_ACCESS_KEY"].encode()
    cache_root = os.environ["DLPACK_CACHE_DIR"]
    prefetch.close()  # waits for its planner: record files are assembled into shards
    files = [os.path.join(d, f) for d, _, fs in os.walk(cache_root) for f in fs]
    records = int(remote._remote.lengths.sum())  # kept one file each or assembled by shard
    assert sum(os.path.getsize(f) for f in files) > records
    assert not any(secret in open(f, "rb").read() for f in files)
    assert secret not in pickle.dumps(remote)


@pytest.mark.parametrize("mode", ["records", "shards"])
def test_prefetch_fills_the_cache_within_the_limit_and_evicts(s3_env, packed, mode):
    local = Dataset(packed[0])
    limit = 60_000 if mode == "records" else 200_000
    remote = Dataset(packed[1], cache_limit=limit)
    batches = _batches(48, 8)
    prefetch = remote.start_prefetch(batches, mode=mode)
    assert prefetch.mode == mode
    for k, batch in enumerate(batches):
        prefetch.wait(k, timeout=60)
        assert prefetch.ready(k)
        _same(local, remote, batch)
        prefetch.release(k)
    stats = prefetch.stats
    assert 0 < stats["max_held"] <= limit and stats["requests"] > 0
    session = remote._remote.session.dir
    prefetch.close()
    prefetch.close()  # idempotent
    left = [f for _, _, files in os.walk(session) for f in files if f != ".lock"]
    assert left == []
    if mode == "shards":  # the pool keeps verified shards: the next epoch fetches nothing
        again = remote.start_prefetch(batches, mode="shards")
        again.wait(len(batches) - 1, timeout=60)
        assert again.stats["requests"] == 0
        again.close()


def test_records_mode_fetches_only_what_the_batches_need(s3_env, packed):
    remote = Dataset(packed[1])
    half = [np.arange(0, 48, 2)]  # this "rank" reads every other sample
    prefetch = remote.start_prefetch(half, mode="records")
    prefetch.wait(0, timeout=60)
    need = int(remote._remote.lengths[half[0]].sum())
    assert need <= prefetch.stats["bytes_fetched"] < 0.8 * remote._remote.lengths.sum()
    prefetch.close()


def test_a_cache_limit_too_small_for_one_batch_is_refused(s3_env, packed):
    with pytest.raises(ValueError, match="cache_limit 'lots': expected a byte count"):
        Dataset(packed[1], cache_limit="lots")
    with pytest.raises(ValueError, match="fetch_mode 'all'"):
        Dataset(packed[1], fetch_mode="all")
    remote = Dataset(packed[1], cache_limit="10KB")
    batch = [np.arange(16)]
    need = int(remote._remote.lengths[:16].sum())
    with pytest.raises(ValueError, match=f"cache_limit 10,000 bytes cannot hold batch 0.*"
                                         f"give cache_limit >= {need:,}"):
        remote.start_prefetch(batch, mode="records")


def test_a_changed_record_in_the_bucket_is_an_error_not_wrong_pixels(s3_env, packed, tmp_path):
    from dlpack_io.reader.remote.storage import ObjectChangedError

    url = f"s3://{BUCKET}/dataset/corrupt"
    store = Store(url)
    for name in os.listdir(packed[0]):
        store.put_file(name, os.path.join(packed[0], name))
    remote = Dataset(url, cache_dir=tmp_path / "cache")  # header + index cached, ETags seen
    shard = remote.shards[1]
    j = 2
    off = int(shard.index["offset"][j])
    data = bytearray(store.get(shard.name))
    data[off + 50] ^= 0x01  # one bit of one record; header and index stay valid
    store.put(shard.name, bytes(data))
    sample = int(remote._remote._starts[1]) + j
    with pytest.raises(ObjectChangedError, match=rf"{shard.name} bytes {off}-.*replaced since"):
        remote[sample]   # the ETag seen at open no longer matches
    # a later open reuses the cached index and has no ETag to compare: the CRCs catch it
    again = Dataset(url, cache_dir=tmp_path / "cache")
    assert again.shards[1].etag is None
    with pytest.raises(fmt.FormatError, match=rf"{shard.name} record {j} \(bytes {off}-.*checksum"):
        again[sample]
    prefetch = again.start_prefetch([np.array([sample, 0])], mode="records")
    with pytest.raises(fmt.FormatError, match=rf"{url}/{shard.name} record {j} \(bytes {off}-"):
        prefetch.wait(0, timeout=60)
    prefetch.close()
    with pytest.raises(fmt.FormatError, match="checksum mismatch"):
        again.start_prefetch([np.array([sample])], mode="shards").wait(0, timeout=60)


def test_a_new_data_set_at_the_same_url_gets_a_new_cache(s3_env, packed, tmp_path):
    url = f"s3://{BUCKET}/dataset/replaced"
    store = Store(url)
    for name in os.listdir(packed[0]):
        store.put_file(name, os.path.join(packed[0], name))
    first = Dataset(url, cache_dir=tmp_path / "cache")
    make_image_folder(tmp_path / "src2", 12, 2, seed=9, size=(40, 40))
    convert(tmp_path / "src2", url, overwrite=True, workers=1, progress=False)
    second = Dataset(url, cache_dir=tmp_path / "cache")
    assert first._remote.key != second._remote.key and len(second) == 12
    assert sorted(os.listdir(tmp_path / "cache")) == sorted([first._remote.key, second._remote.key])
    with pytest.raises(StorageError, match=r"GET s3://\S+/shard-00000.rec bytes \d+-\d+ failed: "
                                           r".*The object was replaced since this data set was "
                                           r"opened: open it again"):  # never the new bytes
        for i in range(len(first)):
            first[i]


def test_spawned_and_forked_workers_read_the_cache_and_never_the_network(s3_env, packed):
    local, remote = Dataset(packed[0]), Dataset(packed[1])
    prefetch = remote.start_prefetch([np.arange(6)], mode="records")
    prefetch.wait(0, timeout=60)
    clone = pickle.loads(pickle.dumps(remote))  # what a spawned worker gets
    _same(local, clone, range(6))
    with pytest.raises(StorageError, match="not in the local cache.*start_prefetch"):
        clone[40]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            ok = all(np.array_equal(remote[i][0], local[i][0]) for i in range(6))
            try:
                remote[40]
                msg = "fetched"
            except StorageError as exc:
                msg = "refused" if "may not fetch" in str(exc) else str(exc)
            os.write(w, f"{ok} {msg}".encode())
        finally:
            os._exit(0)
    os.close(w)
    answer = os.read(r, 1000).decode()
    os.waitpid(pid, 0)
    assert answer == "True refused"
    prefetch.close()


def test_sessions_of_dead_processes_are_swept(s3_env, packed, tmp_path):
    import subprocess
    import sys

    code = (f"from dlpack_io.reader.dataset import Dataset; import os; "
            f"d = Dataset({packed[1]!r}, cache_dir={str(tmp_path)!r}); "
            f"print(d._remote.session.dir, flush=True); os._exit(0)")  # dies without cleaning
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=os.environ, timeout=120)
    assert out.returncode == 0, out.stderr
    stale = out.stdout.strip()
    assert os.path.isdir(stale), out.stderr
    live = Dataset(packed[1], cache_dir=tmp_path)
    other = Dataset(packed[1], cache_dir=tmp_path)   # a second live session is left alone
    assert not os.path.exists(stale)
    assert os.path.isdir(live._remote.session.dir) and os.path.isdir(other._remote.session.dir)
    live.close()
    assert not os.path.exists(live._remote.session.dir) and os.path.isdir(other._remote.session.dir)


def test_dropping_the_data_set_stops_the_planner_thread(s3_env, packed):
    remote = Dataset(packed[1], cache_limit=40_000)
    prefetch = remote.start_prefetch(_batches(48, 4), mode="records")
    prefetch.wait(0, timeout=60)   # later batches wait for budget: the thread is parked
    assert any(t.name == "dlpack-prefetch" for t in threading.enumerate())
    session = remote._remote.session.dir
    del prefetch, remote
    gc.collect()
    assert not any(t.name == "dlpack-prefetch" for t in threading.enumerate())
    assert not os.path.exists(session)


def test_server_killed_mid_epoch_gives_a_clear_error_within_the_deadline(tmp_path, monkeypatch,
                                                                         packed):
    import time

    from dlpack_io.tools.bench.seaweed import SeaweedServer

    with SeaweedServer(tmp_path / "srv", buckets=["dying"]) as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        url = "s3://dying/ds"
        store = Store(url)
        for name in os.listdir(packed[0]):
            store.put_file(name, os.path.join(packed[0], name))
        remote = Dataset(url, cache_dir=tmp_path / "cache", cache_limit=30_000,
                         storage_options={"request_timeout": 2, "retries": 2, "deadline": 5})
        batches = _batches(48, 4)
        prefetch = remote.start_prefetch(batches, mode="records")
        prefetch.wait(0, timeout=60)
        prefetch.release(0)
        server.kill()
        t0 = time.monotonic()
        with pytest.raises(EndpointUnreachableError,
                           match=r"GET s3://dying/ds/shard-\d+\.rec bytes \d+-\d+ endpoint "
                                 r"unreachable after.*Check that the endpoint"):
            for k in range(1, len(batches)):
                prefetch.wait(k, timeout=60)
                prefetch.release(k)
        assert time.monotonic() - t0 < 120  # a hang guard: the deadline (5 s) ends it sooner
        prefetch.close()
        assert not any(t.name == "dlpack-prefetch" for t in threading.enumerate())


def test_two_data_sets_share_the_shard_pool_without_pulling_pinned_shards(s3_env, packed,
                                                                          tmp_path):
    local = Dataset(packed[0])
    first = Dataset(packed[1], cache_dir=tmp_path)
    every = [np.arange(48)]
    held = first.start_prefetch(every, mode="shards")
    held.wait(0, timeout=60)                      # first pins every shard and keeps them
    shard_bytes = sum(e["bytes"] for e in first.manifest["shards"])
    second = Dataset(packed[1], cache_dir=tmp_path, cache_limit=shard_bytes)
    again = second.start_prefetch(every, mode="shards")
    again.wait(0, timeout=60)
    assert again.stats["requests"] == 0          # reused the verified pool, nothing fetched
    pool = os.path.join(first._remote.cache.root, "shards")
    assert all(os.stat(os.path.join(pool, n)).st_nlink == 3 for n in os.listdir(pool))
    from dlpack_io.reader.remote.shardfetch import trim_pool

    trim_pool(first._remote.cache, 0)             # nothing may go: every shard is pinned
    assert len(os.listdir(pool)) == len(first.shards)
    again.close()
    trim_pool(first._remote.cache, 0)
    assert len(os.listdir(pool)) == len(first.shards)   # still pinned by `first`
    _same(local, first, range(48))
    held.close()
    trim_pool(first._remote.cache, 0)             # unpinned now: the pool can be emptied
    assert os.listdir(pool) == []


def _crafted_copy(local: str, tmp_path, damage) -> str:
    """A copy of the local data set with one record's index entry damaged and every
    checksum resealed (tests/crafted.py), as an attacker's bucket would serve it."""
    import shutil

    import crafted

    ds = tmp_path / "crafted"
    shutil.copytree(local, ds)
    name = crafted.load_manifest(ds)["shards"][0]["name"]
    _, data, index, meta = crafted.read_shard(ds / name)
    damage(index)
    crafted.reseal_shard(ds, 0, data, index, meta, counts=False)
    return str(ds)


@pytest.mark.parametrize("field,value,match", [
    ("label", -1, "label -1 outside the classes"),
    ("height", 65535, "more than the limit of"),
    ("orientation", 9, "orientation 9"),
])
def test_a_crafted_remote_data_set_is_refused_like_a_local_one(s3_env, packed, tmp_path, field,
                                                                value, match):
    """The open-path checks of untrusted data sets (reader/format/checks.py) apply to shards
    fetched from a bucket too: damage behind resealed checksums is refused at open."""
    from dlpack_io.reader.format import FormatError

    def damage(index):
        index[1][field] = value
        if field == "height":
            index[1]["width"] = 65535

    local = _crafted_copy(packed[0], tmp_path, damage)
    url = f"s3://{BUCKET}/dataset/crafted-{field}"
    store = Store(url)
    for name in sorted(os.listdir(local)):
        store.put_file(name, os.path.join(local, name))
    with pytest.raises(FormatError, match=match):
        Dataset(local)[0]  # a local shard is checked when it is first opened
    with pytest.raises(FormatError, match=match):
        Dataset(url, cache_dir=tmp_path / "cache")[0]  # a remote one when its index arrives


def test_planes_records_over_s3_are_the_jpeg_pixels(s3_env, s3_server, tmp_path):
    """A --mode planes data set in object storage: every sample is the JPEG's own pixels (the
    jpeg-mode set's), and a Loader epoch through the prefetch planner and the verified cache
    equals the same epoch read from local disk."""
    from dlpack_io.reader import Loader, RandomHorizontalFlip, RandomResizedCrop, jpegdecode

    if not jpegdecode.have_extension():
        pytest.skip("decoded planes need the C extension")
    make_image_folder(tmp_path / "src", 24, 3, seed=8, size=(56, 72))
    for mode in ("jpeg", "planes"):
        convert(tmp_path / "src", tmp_path / mode, mode=mode, shard_size="60KB", workers=1,
                progress=False)
    url = f"s3://{BUCKET}/dataset/planes"
    upload_folder(tmp_path / "planes", url, s3_server.env())
    jpeg, remote = Dataset(tmp_path / "jpeg"), Dataset(url)
    assert {int(remote.record(i)[1]["kind"]) for i in range(len(remote))} == {fmt.KIND_PLANES}
    _same(jpeg, remote, range(24))

    def epoch(ds):
        recipe = [RandomResizedCrop(40), RandomHorizontalFlip()]
        with Loader(ds, batch_size=8, seed=2, num_workers=2, transforms=recipe) as loader:
            return [(x.numpy().copy(), y.numpy().copy()) for x, y in loader]

    for (xa, ya), (xb, yb) in zip(epoch(Dataset(tmp_path / "planes")), epoch(Dataset(url)),
                                  strict=True):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
