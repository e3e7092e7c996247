"""Training from object storage: first epoch, cold cache, through an added round trip.

One command (in .venv-bench for MosaicML Streaming, see scripts/bench.sh)::

    python -m dlpack_io.tools.bench.remote [--images 1000] [--rtts 0,10,20,50] [--rounds 2]

starts a real S3 server (SeaweedFS) and, per round trip, the latency proxy in front of it,
then runs every contender once per round, interleaved, each in a fresh child process
(decode -> random-resized-crop 224 -> flip, batch 256, 2 workers, one epoch, new cache):

  dataloader-1    torch DataLoader, one object per image, one GET at a time per worker
  dataloader-16   the same, 16 GETs in flight per worker (a batch's images fetched at once)
  streaming       MosaicML Streaming reading MDS shards from the same server
  ours-records    dlpack Loader over s3://, record fetch (coalesced ranges, many in flight)
  ours-shards     dlpack Loader over s3://, whole-shard fetch
  ours-local      dlpack Loader over the same data set on local disk (page cache dropped)

Reported per run: images/s, seconds to the first batch, CPU seconds of the loader process
(and its workers), of the server and of the proxy, bytes downloaded. Results go to
OUT/remote.json and OUT/remote.md (+ remote.png when matplotlib is installed).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

BUCKET = "bench"
CONTENDERS = ("dataloader-1", "dataloader-16", "streaming", "ours-records", "ours-shards",
              "ours-local")
BATCH, WORKERS, SHARD_SIZE = 256, 2, "16MB"


# ---- the contenders (run inside a child process) ------------------------------------------
class S3Images:
    """A map-style torch Dataset over one S3 object per image (boto3, one client per process)."""

    def __init__(self, endpoint: str, keys: list, labels: list, inflight: int = 1):
        self.endpoint, self.keys, self.labels, self.inflight = endpoint, keys, labels, inflight
        self._client, self._pid, self._pool = None, None, None

    def __len__(self):
        return len(self.keys)

    def _get(self, i):
        if self._pid != os.getpid():  # boto3 clients must not cross fork: one per worker
            import boto3
            from botocore.config import Config

            self._client = boto3.client("s3", endpoint_url=self.endpoint, config=Config(
                max_pool_connections=max(10, self.inflight)))
            self._pid = os.getpid()
        return self._client.get_object(Bucket=BUCKET, Key=self.keys[i])["Body"].read()

    def _work(self, i, data):
        import torch

        from dlpack_io.tools.bench.work import jpeg_work

        return torch.from_numpy(jpeg_work(data, random.Random(i))), self.labels[i]

    def __getitem__(self, i):
        return self._work(i, self._get(i))

    def __getitems__(self, indices):
        """A whole batch: ``inflight`` GETs at a time (torch calls this per batch)."""
        if self.inflight == 1:
            return [self[i] for i in indices]
        if self._pool is None or self._pid != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            self._get(indices[0]) if self._pid != os.getpid() else None
            self._pool = ThreadPoolExecutor(self.inflight)
        datas = list(self._pool.map(self._get, indices))
        return [self._work(i, d) for i, d in zip(indices, datas)]


def _collate(items):
    import torch

    return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


def _dataloader(endpoint, out, inflight):
    from torch.utils.data import DataLoader

    with open(os.path.join(out, "objects.json")) as f:
        keys, labels = json.load(f)
    ds = S3Images(endpoint, keys, labels, inflight)
    import torch

    return DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                      collate_fn=_collate, generator=torch.Generator().manual_seed(0)), None


def _streaming(endpoint, out, cache):
    from torch.utils.data import DataLoader

    from dlpack_io.tools.bench.peers import import_streaming

    os.environ["S3_ENDPOINT_URL"] = endpoint
    streaming = import_streaming()

    class Worked(streaming.StreamingDataset):
        def __getitem__(self, idx):
            import torch

            from dlpack_io.tools.bench.work import jpeg_work

            item = super().__getitem__(idx)
            return (torch.from_numpy(jpeg_work(item["data"], random.Random(int(idx)))),
                    int(item["cls"]))

    streaming.base.util.clean_stale_shared_memory()
    ds = Worked(remote=f"s3://{BUCKET}/mds", local=os.path.join(cache, "mds"), shuffle=True,
                batch_size=BATCH)
    return DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_collate), None


def _ours(source, cache, mode, rank=0, world_size=1, endpoint=None):
    """Our Loader; over s3:// it starts the prefetch itself (Dataset.start_prefetch)."""
    from dlpack_io.reader import Loader, RandomHorizontalFlip, RandomResizedCrop
    from dlpack_io.reader.dataset import Dataset

    kwargs = {}
    if endpoint:
        kwargs = {"cache_dir": cache, "fetch_mode": mode, "storage_options": {"endpoint": endpoint}}
    ds = Dataset(source, **kwargs)
    loader = Loader(ds, batch_size=BATCH, num_workers=WORKERS, drop_last=False, rank=rank,
                    world_size=world_size, seed=0,
                    transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])
    return loader, ds


def _fetched(ds) -> int | None:
    """Bytes our planner downloaded (the Loader's prefetch handle, found via the data set)."""
    remote = getattr(ds, "_remote", None)
    return None if remote is None else remote.bytes_fetched


def _drop_page_cache(folder):
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_one(name: str, endpoint: str, out: str, rank: int = 0, world_size: int = 1) -> dict:
    """One cold first epoch of contender ``name``; returns its measurements."""
    import resource

    cache = tempfile.mkdtemp(prefix="dlpack-remote-bench-")
    if name.startswith("dataloader"):
        loader, ds = _dataloader(endpoint, out, 1 if name == "dataloader-1" else 16)
    elif name == "streaming":
        loader, ds = _streaming(endpoint, out, cache)
    elif name == "ours-local":
        _drop_page_cache(os.path.join(out, "ours"))
        loader, ds = _ours(os.path.join(out, "ours"), cache, None)
    else:
        loader, ds = _ours(f"s3://{BUCKET}/ours", cache, name.split("-")[1], rank, world_size,
                           endpoint)
    t0 = time.perf_counter()
    first, images = None, 0
    for batch in loader:
        images += len(batch[0])
        first = first or time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    if hasattr(loader, "close"):
        loader.close()
    usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return {"contender": name, "images": images, "seconds": seconds, "first_batch_s": first,
            "images_per_s": images / seconds, "bytes_fetched": ds and _fetched(ds),
            "cpu_s": sum(u.ru_utime + u.ru_stime for u in usage)}


# ---- the parent: data, server, proxy, interleaved rounds -----------------------------------
def prepare(out: str, images: int) -> None:
    """JPEGs (synthetic ImageNet-like), our packed copy, and the MDS copy, once."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    src = os.path.join(out, "jpegs")
    if not os.path.isdir(src):
        make_image_folder(src, images, 100, seed=0)
    if not os.path.exists(os.path.join(out, "ours", "manifest.json")):
        convert(src, os.path.join(out, "ours"), shard_size=SHARD_SIZE, progress=False,
                overwrite=True)


def upload(out: str, store_url_env: dict) -> dict:
    """Put per-image objects, our shards and (if Streaming is installed) MDS in the bucket."""
    from concurrent.futures import ThreadPoolExecutor

    from dlpack_io.reader.storage import Store

    src = os.path.join(out, "jpegs")
    files = sorted(os.path.relpath(os.path.join(d, f), src)
                   for d, _, fs in os.walk(src) for f in fs if f.endswith(".jpg"))
    classes = sorted({f.split("/")[0] for f in files})
    files_store, ours = Store(f"s3://{BUCKET}/files"), Store(f"s3://{BUCKET}/ours")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda f: files_store.put_file(f, os.path.join(src, f)), files))
        list(pool.map(lambda n: ours.put_file(n, os.path.join(out, "ours", n)),
                      os.listdir(os.path.join(out, "ours"))))
    with open(os.path.join(out, "objects.json"), "w") as fh:
        json.dump([[f"files/{f}" for f in files], [classes.index(f.split("/")[0]) for f in files]], fh)
    mds = _write_mds(out, src, files, classes)
    if mds:
        mds_store = Store(f"s3://{BUCKET}/mds")
        for name in os.listdir(mds):
            mds_store.put_file(name, os.path.join(mds, name))
    return {"images": len(files), "mds": bool(mds),
            "bytes": sum(os.path.getsize(os.path.join(src, f)) for f in files)}


def _write_mds(out, src, files, classes):
    try:
        from dlpack_io.tools.bench.peers import import_streaming

        streaming = import_streaming()
    except Exception:  # not installed (only in .venv-bench): the contender is reported missing
        return None
    path = os.path.join(out, "mds")
    if not os.path.exists(os.path.join(path, "index.json")):
        with streaming.MDSWriter(out=path, columns={"data": "bytes", "cls": "int"},
                                 size_limit=1 << 24) as sink:
            for f in files:
                with open(os.path.join(src, f), "rb") as fh:
                    sink.write({"data": fh.read(), "cls": classes.index(f.split("/")[0])})
    return path


def _child(name, endpoint, out, rank=0, world_size=1, timeout=900) -> dict:
    cmd = [sys.executable, "-m", "dlpack_io.tools.bench.remote", "--one", name, "--endpoint",
           endpoint, "--out", out, "--rank", str(rank), "--world-size", str(world_size)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {"contender": name, "error": tail}
    return json.loads(lines[-1])


def measure(out: str, *, images: int, rtts, rounds: int, contenders=CONTENDERS) -> dict:
    """Every contender at every RTT, ``rounds`` times, interleaved; plus the 2-rank bytes."""
    from dlpack_io.tools.latencyproxy import LatencyProxy, process_cpu_seconds
    from dlpack_io.tools.seaweed import SeaweedServer

    os.makedirs(out, exist_ok=True)
    prepare(out, images)
    runs = []
    with SeaweedServer(os.path.join(out, "seaweed"), buckets=[BUCKET]) as server:
        os.environ.update(server.env())
        data = upload(out, server.env())
        for rnd in range(rounds):
            for rtt in rtts:
                with LatencyProxy("127.0.0.1", server.port, rtt=rtt / 1000) as proxy:
                    for name in contenders:
                        if name == "streaming" and not data["mds"]:
                            runs.append({"contender": name, "rtt_ms": rtt, "error": "not installed"})
                            continue
                        s0, p0 = process_cpu_seconds(server.proc.pid), proxy.cpu_seconds()
                        row = _child(name, proxy.endpoint, out)
                        row.update(rtt_ms=rtt, round=rnd,
                                   server_cpu_s=process_cpu_seconds(server.proc.pid) - s0,
                                   proxy_cpu_s=proxy.cpu_seconds() - p0)
                        runs.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
        ranks = [_child("ours-records", server.endpoint, out, r, 2) for r in (0, 1)]
    return {"date": time.strftime("%Y-%m-%d"), "machine": _machine(), "data": data,
            "runs": runs, "two_ranks": ranks}


def _machine() -> str:
    import platform

    return f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"


def main(argv=None) -> None:
    """Command line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="bench-out/remote")
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--rtts", default="0,10,20,50")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", help="comma-separated contenders")
    p.add_argument("--one", help=argparse.SUPPRESS)       # child mode
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--world-size", type=int, default=1, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(run_one(a.one, a.endpoint, a.out, a.rank, a.world_size)), flush=True)
        return
    contenders = tuple(a.only.split(",")) if a.only else CONTENDERS
    result = measure(a.out, images=a.images, rtts=[int(x) for x in a.rtts.split(",")],
                     rounds=a.rounds, contenders=contenders)
    with open(os.path.join(a.out, "remote.json"), "w") as f:
        json.dump(result, f, indent=1)
    from dlpack_io.tools.bench.remote_report import chart, markdown

    text = markdown(result)
    with open(os.path.join(a.out, "remote.md"), "w") as f:
        f.write(text + "\n")
    chart(result, os.path.join(a.out, "remote.png"))
    print(text)


if __name__ == "__main__":
    main()
