"""The remote section's contenders (families.py, section "remote"): one cold first epoch each,
reading what remote.upload put in the bucket, decode -> random-resized-crop 224 -> flip,
batch 256, 2 workers. Each builder returns (loader, our Dataset or None)."""
from __future__ import annotations

import os
import random

BUCKET = "bench"
BATCH, WORKERS = 256, 2


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


def dataloader(endpoint, out, cache, rank, world_size, *, inflight: int = 1):
    """torch DataLoader over one object per image, ``inflight`` GETs at a time per worker."""
    import json

    import torch
    from torch.utils.data import DataLoader

    with open(os.path.join(out, "objects.json")) as f:
        keys, labels = json.load(f)
    ds = S3Images(endpoint, keys, labels, inflight)
    return DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                      collate_fn=_collate, generator=torch.Generator().manual_seed(0)), None


def streaming(endpoint, out, cache, rank, world_size):
    """MosaicML Streaming's StreamingDataset(remote=s3://.../mds) in a DataLoader."""
    from torch.utils.data import DataLoader

    from dlpack_io.tools.bench.peers import import_streaming

    os.environ["S3_ENDPOINT_URL"] = endpoint
    base = import_streaming()

    class Worked(base.StreamingDataset):
        def __getitem__(self, idx):
            import torch

            from dlpack_io.tools.bench.work import jpeg_work

            item = super().__getitem__(idx)
            return (torch.from_numpy(jpeg_work(item["data"], random.Random(int(idx)))),
                    int(item["cls"]))

    base.base.util.clean_stale_shared_memory()
    ds = Worked(remote=f"s3://{BUCKET}/mds", local=os.path.join(cache, "mds"), shuffle=True,
                batch_size=BATCH)
    return DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_collate), None


def litdata(endpoint, out, cache, rank, world_size):
    """LitData's StreamingDataset(s3://.../litdata) + StreamingDataLoader, its chunk cache in
    ``cache`` (kept between epochs: epoch 1 reads what epoch 0 downloaded)."""
    import litdata as ld
    import litdata.streaming.downloader as downloader

    # LitData's obstore prefetch path builds its client options without allow_http, so it
    # cannot reach a plain-http test server (real S3 is https); allowing http changes
    # nothing else and keeps LitData on its fast path instead of its boto3 fallback.
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS,
                                          "allow_http": "true"}

    class Worked(ld.StreamingDataset):
        def __getitem__(self, idx):
            import torch

            from dlpack_io.tools.bench.work import jpeg_work

            item = super().__getitem__(idx)
            index = idx.index if hasattr(idx, "index") else idx
            return (torch.from_numpy(jpeg_work(item["data"], random.Random(int(index)))),
                    int(item["cls"]))

    ds = Worked(input_dir=f"s3://{BUCKET}/litdata", cache_dir=os.path.join(cache, "litdata"),
                shuffle=True, seed=0, storage_options={"endpoint_url": endpoint})
    # not persistent: the workers are reaped after each epoch, so their CPU is counted
    return ld.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS,
                                  collate_fn=_collate), None


def _loader(ds, rank: int = 0, world_size: int = 1):
    from dlpack_io.reader import Loader, RandomHorizontalFlip, RandomResizedCrop

    return Loader(ds, batch_size=BATCH, num_workers=WORKERS, drop_last=False, rank=rank,
                  world_size=world_size, seed=0,
                  transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])


def ours(endpoint, out, cache, rank, world_size, *, fetch_mode: str = "records"):
    """Our Loader over s3://bench/ours; the data set starts the prefetch itself."""
    from dlpack_io.reader import Dataset

    ds = Dataset(f"s3://{BUCKET}/ours", cache_dir=cache, fetch_mode=fetch_mode,
                 storage_options={"endpoint": endpoint})
    return _loader(ds, rank, world_size), ds


def local(endpoint, out, cache, rank, world_size):
    """Our Loader over the same data set on local disk, its page cache dropped first."""
    from dlpack_io.reader import Dataset

    folder = os.path.join(out, "ours")
    for name in os.listdir(folder):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    ds = Dataset(folder)
    return _loader(ds, rank, world_size), ds
