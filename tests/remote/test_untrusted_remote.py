"""The places around a remote data set are untrusted too (issue 26, kinds 1 and 2): a cache
folder others can write, and a server that answers wrong, too much, forever or too slowly.

The server is tests/hostile_s3.py (a real HTTP server on 127.0.0.1 that obstore talks to);
the cache entries are planted with real symlinks, FIFOs and edited files."""
from __future__ import annotations

import json
import logging
import os
import stat
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from hostile_s3 import HostileS3  # noqa: E402

from dlpack_io.packer import convert  # noqa: E402
from dlpack_io.reader import format as fmt  # noqa: E402
from dlpack_io.reader.dataset import Dataset  # noqa: E402
from dlpack_io.reader.remote import cache as cache_mod  # noqa: E402
from dlpack_io.reader.remote.cache import CacheEntryError  # noqa: E402
from dlpack_io.reader.remote.storage import StorageError  # noqa: E402
from dlpack_io.tools.remoteverify import verify_remote  # noqa: E402
from dlpack_io.tools.synth import make_image_folder  # noqa: E402

URL = "s3://hostile-bucket/set"
PATIENCE = {"request_timeout": 1, "connect_timeout": 1, "retries": 1, "deadline": 3}


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A local record data set of 24 JPEGs in several shards."""
    root = tmp_path_factory.mktemp("hostile")
    make_image_folder(root / "src", 24, 3, seed=7, size=(32, 40))
    convert(root / "src", root / "set", shard_size="20KB", workers=1, progress=False)
    return root / "set"


@pytest.fixture
def server(packed, monkeypatch, tmp_path, hang_deadline):
    """The hostile server over ``packed``, AWS_* pointing at it, a private cache folder."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    with HostileS3(packed) as srv:
        for key, value in srv.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        yield srv


def _open(cache, **kw):
    return Dataset(URL, cache_dir=cache, storage_options=PATIENCE, **kw)


def _first_shard(packed) -> str:
    return json.loads((packed / fmt.MANIFEST_NAME).read_text())["shards"][0]["name"]


def _key(packed) -> str:
    raw = (packed / fmt.MANIFEST_NAME).read_bytes()
    return cache_mod.dataset_key(raw, json.loads(raw)["checksum"])


# ---- kind 2: the server -----------------------------------------------------------------
@pytest.mark.parametrize("fault", ["long", "endless"])
def test_a_body_longer_than_asked_is_cut_off_and_named(server, packed, tmp_path, fault):
    server.faults[_first_shard(packed)] = fault
    t0 = time.monotonic()
    with pytest.raises(StorageError) as info:
        _open(tmp_path / "cache")
    message = str(info.value)
    assert f"{URL}/{_first_shard(packed)}".replace("s3://", "s3://") in message
    assert "bytes 0-4095" in message and "where 4096 were asked for" in message
    assert time.monotonic() - t0 < 10  # cut off at once, not after 1 TB (endless)


def test_a_record_body_longer_than_asked_fails_the_read_naming_the_range(server, packed,
                                                                         tmp_path):
    ds = _open(tmp_path / "cache")
    entry = ds.shards[0].index[2]
    server.faults[_first_shard(packed)] = "long"
    with pytest.raises(StorageError, match=rf"bytes {int(entry['offset'])}-"
                                           rf"{int(entry['offset']) + int(entry['length']) - 1}"
                                           rf" failed: BodyOverrun"):
        ds[2]
    server.faults.clear()
    assert ds[2][1] == Dataset(packed)[2][1]  # the next good answer is used


def test_a_slow_body_ends_within_the_deadline_naming_the_url(server, packed, tmp_path):
    server.faults[fmt.MANIFEST_NAME] = "slow"
    t0 = time.monotonic()
    with pytest.raises(StorageError, match=rf"GET {URL}/{fmt.MANIFEST_NAME} bytes 0-\d+ timed out "
                                           rf"\(the server answered too slowly\) after 2 "
                                           rf"attempts"):
        _open(tmp_path / "cache")
    assert time.monotonic() - t0 < PATIENCE["deadline"] + 2 * PATIENCE["request_timeout"] + 2


def test_wrong_bytes_for_a_range_are_refused_by_checksum(server, packed, tmp_path):
    ds = _open(tmp_path / "cache")
    server.faults[_first_shard(packed)] = "flip"
    with pytest.raises(fmt.FormatError, match=rf"{URL}/{_first_shard(packed)} record 1 .*"
                                              r"checksum mismatch"):
        ds[1]


def test_a_claimed_size_beyond_the_manifest_is_refused_before_reading(server, packed,
                                                                      tmp_path):
    server.faults[fmt.MANIFEST_NAME] = "huge-size"
    with pytest.raises(fmt.FormatError, match=rf"{fmt.MANIFEST_NAME}: {2**50} bytes, more than"):
        _open(tmp_path / "cache")
    report = verify_remote(URL, progress=False)
    assert not report.ok and f"{2**50} bytes" in report.problems[0]["problem"]
    server.faults.clear()
    server.faults[_first_shard(packed)] = "huge-size"
    report = verify_remote(URL, progress=False)
    assert [p["problem"] for p in report.problems if _first_shard(packed) in p["where"]] == \
        [f"object is {2**50} bytes, the manifest says "
         f"{(packed / _first_shard(packed)).stat().st_size} (truncated or replaced)"]
    assert not [r for r in server.requests if r[0] == "GET" and r[1] == _first_shard(packed)]


def test_verify_of_a_server_sending_too_much_reports_it(server, packed):
    server.faults[_first_shard(packed)] = "endless"
    report = verify_remote(URL, progress=False)
    problems = [p for p in report.problems if _first_shard(packed) in p["where"]]
    assert not report.ok and len(problems) == 1 and "BodyOverrun" in problems[0]["problem"]
    assert report.shards_checked == len(json.loads((packed / fmt.MANIFEST_NAME).read_text())
                                        ["shards"])  # the other shards were still checked


# ---- kind 1: the cache folder -----------------------------------------------------------
def _outside(tmp_path):
    """A folder outside the cache with a file that must survive."""
    out = tmp_path / "outside"
    (out / "keep").mkdir(parents=True)
    (out / "keep" / "precious.txt").write_text("mine")
    (out / "precious.txt").write_text("mine")
    return out


def _intact(out):
    assert (out / "precious.txt").read_text() == "mine"
    assert (out / "keep" / "precious.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["keep", "precious.txt"]


@pytest.mark.parametrize("planted", ["sessions", "key"])
def test_a_cache_folder_that_is_a_link_is_never_followed(server, packed, tmp_path, planted):
    out, cache = _outside(tmp_path), tmp_path / "cache"
    root = cache / _key(packed)
    if planted == "key":
        cache.mkdir()
        root.symlink_to(out)
    else:
        root.mkdir(parents=True)
        (root / "sessions").symlink_to(out)
    with pytest.raises(CacheEntryError, match=rf"{planted if planted == 'sessions' else root.name}"
                                              rf": is a symbolic link where the cache keeps a "
                                              rf"folder"):
        _open(cache)
    _intact(out)


def test_planted_session_entries_are_left_alone(server, packed, tmp_path):
    out, cache = _outside(tmp_path), tmp_path / "cache"
    sessions = cache / _key(packed) / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "123-deadbeef").symlink_to(out)               # looks like a session: a link
    (sessions / "124-deadbeef").symlink_to(out / "keep")
    (sessions / "not-a-session").mkdir()                     # a folder with a foreign name
    (sessions / "not-a-session" / "x").write_text("theirs")
    ds = _open(cache)
    assert ds[0][1] == Dataset(packed)[0][1]
    ds.close()
    _intact(out)
    assert (sessions / "not-a-session" / "x").read_text() == "theirs"
    assert os.path.islink(sessions / "123-deadbeef")


@pytest.mark.parametrize("kind", ["fifo", "devzero", "huge", "wrong"])
def test_a_planted_index_file_is_ignored_and_fetched_again(server, packed, tmp_path, kind,
                                                           caplog):
    cache = tmp_path / "cache"
    index_dir = cache / _key(packed) / "index"
    index_dir.mkdir(parents=True)
    path = index_dir / (_first_shard(packed) + ".idx")
    if kind == "fifo":
        os.mkfifo(path)                      # reading it would wait forever
    elif kind == "devzero":
        path.symlink_to("/dev/zero")         # reading it would never end
    elif kind == "huge":
        with open(path, "wb") as f:          # sparse: larger than the shard
            f.truncate(64 * 2**30)
    else:
        path.write_bytes(b"\0" * 4096)
    with caplog.at_level(logging.WARNING):
        ds = _open(cache)
    assert ds[0][1] == Dataset(packed)[0][1]
    assert str(path) in caplog.text
    assert stat.S_ISREG(os.lstat(path).st_mode)  # replaced by the verified copy
    assert os.path.getsize(path) < (packed / _first_shard(packed)).stat().st_size


def test_a_flipped_byte_in_a_cached_shard_is_discarded_and_fetched_again(server, packed,
                                                                        tmp_path, caplog):
    cache = tmp_path / "cache"
    ds = _open(cache)
    prefetch = ds.start_prefetch([np.arange(len(ds))], mode="shards")
    prefetch.wait(0, timeout=30)
    ds.close()
    pool = cache / _key(packed) / "shards" / _first_shard(packed)
    entry = Dataset(packed).shards[0].index[3]
    data = bytearray(pool.read_bytes())
    data[int(entry["offset"]) + 5] ^= 0x01
    pool.write_bytes(bytes(data))
    ds = _open(cache)
    prefetch = ds.start_prefetch([np.arange(len(ds))], mode="shards")
    prefetch.wait(0, timeout=30)
    with caplog.at_level(logging.WARNING):
        image, label = ds[3]
    assert label == Dataset(packed)[3][1] and np.array_equal(image, Dataset(packed)[3][0])
    assert "fails its checksum" in caplog.text and str(pool) in caplog.text
    assert not pool.exists()  # the next run does not trust it either


def test_folders_we_create_are_private(server, packed, tmp_path):
    cache = tmp_path / "cache"
    ds = _open(cache)
    ds[0]
    root = cache / _key(packed)
    for folder in (cache, root, root / "index", root / "shards", root / "sessions",
                   root / "sessions" / ds._remote.session.sid):
        assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700, folder
    assert stat.S_IMODE(os.lstat(root / fmt.MANIFEST_NAME).st_mode) == 0o600


def test_a_folder_planted_at_a_pooled_shard_name_is_left_alone(server, packed, tmp_path):
    cache = tmp_path / "cache"
    planted = cache / _key(packed) / "shards" / _first_shard(packed)
    (planted / "x").mkdir(parents=True)
    ds = _open(cache)
    prefetch = ds.start_prefetch([np.arange(len(ds))], mode="shards")
    prefetch.wait(0, timeout=30)
    assert [ds[i][1] for i in range(len(ds))] == [Dataset(packed)[i][1] for i in range(len(ds))]
    assert planted.is_dir() and (planted / "x").is_dir()


@pytest.mark.parametrize("fault, error, words", [
    ("flip", fmt.FormatError, "not a dlpack record shard"),  # (its first byte)
    ("long", StorageError, "BodyOverrun"),
    ("endless", StorageError, "BodyOverrun"),
    ("slow", StorageError, "timed out (the server answered too slowly)")])
def test_whole_shards_received_directly_from_a_hostile_server(server, packed, tmp_path, fault,
                                                              error, words):
    """Mode "shards" reads each part straight off the socket into the shard's file: a wrong
    byte fails the whole-shard check; a body longer than asked, endless or dripping is handed
    to the client, whose budget and deadline rule. Each names the shard; nothing reaches the
    pool; the prefetch ends within its deadline."""
    ds = _open(tmp_path / "cache")
    name = _first_shard(packed)
    server.faults[name] = fault
    t0 = time.monotonic()
    prefetch = ds.start_prefetch([np.arange(len(ds.shards[0].index))], mode="shards")
    with pytest.raises(error) as info:
        prefetch.wait(0, timeout=30)
    prefetch.close()
    assert f"{URL}/{name}" in str(info.value) and words in str(info.value), str(info.value)
    assert time.monotonic() - t0 < PATIENCE["deadline"] + 2 * PATIENCE["request_timeout"] + 2
    assert not (tmp_path / "cache" / _key(packed) / "shards" / name).exists()
    assert any(m == "GET" and n == name for m, n, _ in server.requests)


@pytest.mark.parametrize("fault", ["slow", "endless"])
def test_growing_ranges_from_a_dripping_or_endless_server_end_within_the_deadline(
        server, packed, tmp_path, fault):
    """Epoch 0 of a set that fits (ranges received straight into growing shards): a server
    dripping a byte every 0.5 s, or never ending a body, fails the prefetch within its
    deadline with the client's words, never a hang."""
    ds = _open(tmp_path / "cache")
    server.faults["*"] = fault
    t0 = time.monotonic()
    prefetch = ds.start_prefetch([np.arange(len(ds))])
    assert prefetch._planner.grow is not None  # (all kept: the growing path)
    with pytest.raises(StorageError, match="timed out|BodyOverrun"):
        prefetch.wait(0, timeout=30)
    prefetch.close()
    assert time.monotonic() - t0 < PATIENCE["deadline"] + 2 * PATIENCE["request_timeout"] + 2
