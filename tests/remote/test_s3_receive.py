"""Ranges received straight into their growing file (Store.receive_range, growing.RangeSink):
exactly the bytes asked for off a real SeaweedFS, only records whose CRCs match ever written,
and everything unusual handed back to the client path (False), whose checks rule."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from dlpack_io.reader import format as fmt
from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.remote import growing
from dlpack_io.reader.remote.fetchplan import extents
from dlpack_io.reader.remote.growing import RangeSink, ReceiveStopped
from dlpack_io.reader.remote.shardfetch import PartSink
from dlpack_io.reader.remote.storage import Store

from helpers import batches_equal, pack_and_upload

URL = "s3://dlpack-test/receive/base"


class Collect:
    """A sink keeping what it is handed, through a buffer of ``size`` bytes."""

    def __init__(self, size: int):
        self.buffer, self.out = memoryview(bytearray(size)), bytearray()

    def space(self):
        return self.buffer

    def got(self, n):
        self.out += self.buffer[:n]


@pytest.fixture
def obj(s3_env):
    store = Store("s3://dlpack-test/receive-raw")
    data = np.random.default_rng(1).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    store.put("blob", data)
    return store, data, store.head("blob")["etag"]


def test_receive_range_hands_over_exactly_the_range(obj):
    store, data, etag = obj
    for start, end, size in ((0, 300_000, 65_536), (12_345, 200_001, 7_000), (299_999, 300_000, 1)):
        sink = Collect(size)
        assert store.receive_range("blob", start, end, etag=etag, sink=sink)
        assert bytes(sink.out) == data[start:end]
    sink = Collect(4096)  # a connection kept alive, then a second range on it
    assert store.receive_range("blob", 5, 9, etag=None, sink=sink) and sink.out == data[5:9]


def test_anything_unusual_is_handed_back_to_the_client_path(obj, monkeypatch):
    store, data, etag = obj
    assert not store.receive_range("blob", 0, 10, etag='"not-its-etag"', sink=Collect(64))
    assert not store.receive_range("blob", 299_990, 300_010, etag=etag, sink=Collect(64))  # short
    assert not store.receive_range("missing", 0, 10, etag=None, sink=Collect(64))
    assert not store.receive_range("blob", 10, 10, etag=None, sink=Collect(64))
    sink = Collect(64)
    assert store.receive_range("blob", 0, 10, etag=etag, sink=sink) and sink.out == data[:10]
    monkeypatch.setenv("DLPACK_DIRECT_RECEIVE", "0")  # read once per store: a new one
    assert not Store("s3://dlpack-test/receive-raw").receive_range("blob", 0, 10, etag=None,
                                                                    sink=Collect(64))
    monkeypatch.delenv("DLPACK_DIRECT_RECEIVE")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # the client would use it
    assert not Store("s3://dlpack-test/receive-raw").receive_range("blob", 0, 10, etag=None,
                                                                    sink=Collect(64))


def test_a_sink_that_raises_closes_the_connection_and_the_next_range_works(obj):
    store, data, etag = obj

    class Boom(Collect):
        def got(self, n):
            raise RuntimeError("stop here")
    with pytest.raises(RuntimeError, match="stop here"):
        store.receive_range("blob", 0, 200_000, etag=etag, sink=Boom(4096))
    sink = Collect(4096)
    assert store.receive_range("blob", 100, 5_000, etag=etag, sink=sink)
    assert sink.out == data[100:5_000]


def _entries(layout, data):
    """An index of records at (offset, image length, field block length) in ``data``."""
    dt = np.dtype([("offset", "<u8"), ("length", "<u4"), ("crc", "<u4"),
                   ("fields_length", "<u4"), ("fields_crc", "<u4")])
    out = np.zeros(len(layout), dtype=dt)
    for i, (off, length, flen) in enumerate(layout):
        out[i] = (off, length, fmt.crc32(data[off:off + length]), flen,
                  fmt.crc32(data[off + length:off + length + flen]))
    return out


def _feed(sink, data, start, end, step):
    at = start
    while at < end:
        space = sink.space()
        n = min(len(space), step, end - at)
        space[:n] = data[at:at + n]
        sink.got(n)
        at += n


@pytest.mark.parametrize("step", [1, 777, 50_000, 10**6])
def test_range_sink_writes_verified_records_at_their_offsets_and_nothing_else(tmp_path, step,
                                                                             monkeypatch):
    monkeypatch.setattr(growing, "_RECEIVE_BUFFER", 4096)  # records larger than the buffer
    rng = np.random.default_rng(step)
    data = rng.integers(0, 256, 60_000, dtype=np.uint8).tobytes()
    # adjacent records, a bridged gap (1000-1999 and 30_000-30_099 not requested), a field
    # block, a record of 20 kB (5x the buffer), records out of offset order in the index
    layout = [(2_000, 3_000, 0), (5_000, 1_500, 700), (30_100, 20_000, 0), (7_200, 4_000, 96),
              (11_296, 18_704, 0)]
    entries = _entries(layout, data)
    bad = bytearray(data)
    bad[7_200 + 4_000 + 50] ^= 0xFF  # the field block of the record at 7_200
    path = tmp_path / "grow"
    for source, broken in ((data, None), (bytes(bad), 7_200)):
        with open(path, "wb") as f:
            f.truncate(60_000)
        fd = os.open(path, os.O_RDWR)
        sink = RangeSink(fd, entries, 1_000, lambda: False)
        os.close(fd)  # the sink writes through its own descriptor
        _feed(sink, source, 1_000, 50_100, step)
        sink.close()
        on_disk = open(path, "rb").read()
        expected = bytearray(60_000)
        for off, length, flen in layout:
            if off != broken:
                expected[off:off + length + flen] = data[off:off + length + flen]
        assert on_disk == bytes(expected)  # gaps and the damaged record: never written
        failed = sink.failed()
        assert (failed is None) if broken is None else \
            int(sink.entries[failed]["offset"]) == broken


def test_range_sink_tells_a_short_stream_and_stops_when_told(tmp_path):
    data = bytes(range(256)) * 100
    entries = _entries([(0, 10_000, 0), (10_000, 5_000, 0)], data)
    with open(tmp_path / "g", "wb") as f:
        f.truncate(len(data))
    fd = os.open(tmp_path / "g", os.O_RDWR)
    sink = RangeSink(fd, entries, 0, lambda: False)
    _feed(sink, data, 0, 12_000, 3_000)  # the second record did not come whole
    assert int(sink.entries[sink.failed()]["offset"]) == 10_000
    sink.close()
    sink.close()  # idempotent
    stop = RangeSink(fd, entries, 0, lambda: True)
    with pytest.raises(ReceiveStopped):
        _feed(stop, data, 0, 15_000, 3_000)
    stop.close()
    os.close(fd)


def test_part_sink_writes_each_read_at_its_offset_through_its_own_descriptor(tmp_path):
    data = np.random.default_rng(3).integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    with open(tmp_path / "s", "wb") as f:
        f.truncate(60_000)
    fd = os.open(tmp_path / "s", os.O_RDWR)
    sink = PartSink(fd, 7_000)
    os.close(fd)  # the download gave up: the receive still writes where it did, nowhere else
    _feed(sink, data, 0, len(data), 6_000)
    sink.close()
    sink.close()  # idempotent
    written = (tmp_path / "s").read_bytes()
    assert written == bytes(7_000) + data + bytes(3_000)
    stop = PartSink(os.open(tmp_path / "s", os.O_RDWR), 0, lambda: True)
    with pytest.raises(ReceiveStopped):
        stop.got(1)
    stop.close()


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    return pack_and_upload(tmp_path_factory.mktemp("receive"), URL, s3_server.env(), count=40,
                           classes=3, seed=7, size=(48, 64))


def _epoch(ds):
    from dlpack_io.reader import Loader, Output, RandomHorizontalFlip, RandomResizedCrop

    loader = Loader(ds, batch_size=8, seed=3, output=Output(return_index=True),
                    transforms=[RandomResizedCrop(24), RandomHorizontalFlip()])
    out = [(idx.copy(), images.clone(), labels.clone()) for images, labels, idx in loader]
    loader.close()
    return out


def test_epoch_0_received_directly_equals_local_and_a_tampered_byte_never_lands(s3_env, packed,
                                                                               caplog):
    remote = Dataset(URL)
    store, direct, client, tampered = remote._remote.store, [], [], []
    real_receive, real_get = store.receive_range, store.aget_range

    def tampering(name, start, end, *, etag, sink):
        first = not tampered and end - start > 1000  # (ranges are received on several
        if first:  # threads at once)
            tampered.append((name, start, end))
        direct.append((name, start, end))

        class Flip:  # the first range's bytes: one flipped on the way in
            def space(self):
                self.view = sink.space()
                return self.view

            def got(self, n):
                if first and not getattr(self, "done", 0):
                    self.view[n // 2] ^= 0xFF
                    self.done = 1
                sink.got(n)
        ok = real_receive(name, start, end, etag=etag, sink=Flip() if first else sink)
        if first:  # the damaged record's bytes are not in the file
            k = [s.name for s in remote.shards].index(name)
            grown = open(remote._remote.growing.path(k), "rb").read()
            assert ok and sink.failed() is not None
            e = sink.entries[sink.failed():sink.failed() + 1]
            at, span = int(e["offset"][0]), int(extents(e)[0])
            assert grown[at:at + span] == bytes(span)
        return ok

    async def counted(name, start, end, **kw):
        client.append((name, start, end))
        return await real_get(name, start, end, **kw)
    store.receive_range, store.aget_range = tampering, counted
    with caplog.at_level(logging.WARNING):
        batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    assert "checksum mismatch in the downloaded bytes" in caplog.text
    assert len(direct) > 1 and client.count(tampered[0]) == 1  # only the bad one went that way
    assert [r for r in client if r[2] - r[1] > 1000] == tampered
    assert remote._remote.whole.assembled == len(remote.shards)


def _serving_100_bytes(monkeypatch, *, request_timeout: float, then):
    """(listener, Store) of a server of the test's own that answers one GET with the head of
    a 206 of 100 bytes and then calls ``then(conn)`` (which sends what it likes); the Store
    points at it (no AWS_* variable or proxy of the environment in the way)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Length: 100\r\n"
                     b"Content-Range: bytes 0-99/100\r\n\r\n")
        try:
            then(conn)
        except OSError:
            pass  # the client gave up: what it should do
        conn.close()
    threading.Thread(target=serve, daemon=True).start()
    for key in [k for k in os.environ if k.startswith("AWS_") or k.lower().endswith("_proxy")]:
        monkeypatch.delenv(key)
    return listener, Store("s3://bucket/p", storage_options={
        "endpoint": f"http://127.0.0.1:{listener.getsockname()[1]}", "allow_http": True,
        "access_key_id": "k", "secret_access_key": "s", "region": "us-east-1",
        "request_timeout": request_timeout})


def test_interrupt_ends_a_receive_waiting_on_a_stalled_server_at_once(tmp_path, monkeypatch):
    """A server that sends the headers and 10 of 100 bytes, then nothing: interrupt() (what
    closing a prefetch calls) ends the read now, not after request_timeout (600 s here),
    and a stopped sink's receive does not count as a network error."""
    import threading

    release = threading.Event()

    def ten_then_nothing(conn):
        conn.sendall(bytes(10))
        release.wait(60)
    listener, store = _serving_100_bytes(monkeypatch, request_timeout=600,
                                         then=ten_then_nothing)
    first, stop, result = threading.Event(), threading.Event(), []

    class Waiting(Collect):
        def got(self, n):
            super().got(n)
            first.set()

        def stopped(self):
            return stop.is_set()
    sink = Waiting(10)  # a read of 10 bytes comes back; the next waits
    worker = threading.Thread(target=lambda: result.append(
        store.receive_range("obj", 0, 100, etag=None, sink=sink)))
    worker.start()
    assert first.wait(60) and sink.out == bytes(10)
    stop.set()
    store.interrupt(sink)
    worker.join(60)
    release.set()
    assert not worker.is_alive() and result == [False]
    assert store.receives_directly()  # not taken for a network error
    store.interrupt(sink)  # nothing runs: nothing happens
    listener.close()


def test_whole_shards_are_received_directly_and_a_tampered_part_is_never_published(
        s3_env, packed, tmp_path):
    """Mode "shards": every part of every shard read straight into the shard's file (no
    request through the client); a byte flipped on the way in fails the whole-shard check,
    naming the shard and record, and nothing reaches the pool."""
    remote = Dataset(URL, cache_dir=tmp_path / "ok", fetch_mode="shards")
    store, direct, client = remote._remote.store, [], []
    real_receive, real_get = store.receive_range, store.aget_range

    def counted_receive(name, start, end, *, etag, sink):
        direct.append((name, start, end))
        return real_receive(name, start, end, etag=etag, sink=sink)

    async def counted_get(name, start, end, **kw):
        client.append((name, start, end))
        return await real_get(name, start, end, **kw)
    store.receive_range, store.aget_range = counted_receive, counted_get
    batches_equal(_epoch(Dataset(packed)), _epoch(remote))
    assert sorted(n for n, _, _ in direct) == sorted(s.name for s in remote.shards)
    assert client == []  # (each shard is one part: 30 KB < shardfetch.PART)

    damaged = Dataset(URL, cache_dir=tmp_path / "bad", fetch_mode="shards")
    store = damaged._remote.store
    real_receive = store.receive_range

    def flipping(name, start, end, *, etag, sink):
        class Flip:
            def space(self):
                self.view = sink.space()
                return self.view

            def got(self, n):
                self.view[n - 1] ^= 0xFF  # the part's last byte read so far
                sink.got(n)
        return real_receive(name, start, end, etag=etag, sink=Flip())
    store.receive_range = flipping
    first = damaged.shards[0]
    prefetch = damaged.start_prefetch([np.arange(len(first.index))])
    with pytest.raises(fmt.FormatError, match=rf"{first.name}.*checksum"):
        prefetch.wait(0, timeout=60)
    prefetch.close()
    assert not os.path.exists(damaged._remote.cache.pool_path(first.name))


def test_a_server_dripping_bytes_is_given_request_timeout_for_the_whole_range(monkeypatch):
    """One byte every 0.1 s never lets a read time out; the whole range must come within
    request_timeout (1 s here), as through the client: False (the client path rules),
    well before the 100 bytes would have dripped in."""
    import threading
    import time

    done = threading.Event()

    def drip(conn):
        for _ in range(100):
            if done.wait(0.1):  # a drip, not a synchronisation
                break
            conn.sendall(b"x")
    listener, store = _serving_100_bytes(monkeypatch, request_timeout=1, then=drip)
    sink, t0 = Collect(64), time.monotonic()
    assert not store.receive_range("obj", 0, 100, etag=None, sink=sink)
    elapsed = time.monotonic() - t0
    done.set()
    assert len(sink.out) < 100 and elapsed < 5, (len(sink.out), elapsed)  # (10 s of drip)
    assert not store.receives_directly()  # a server this slow: the client's way from now on
    listener.close()
