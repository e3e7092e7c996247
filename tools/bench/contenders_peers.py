"""The peers in their own formats: WebDataset, MosaicML Streaming, LitData.

Each does the shared work (``work.sample_work``) in its own worker machinery and batches with
the shared collate. Their shuffles are their own: WebDataset shuffles shards plus a 1,000-sample
buffer (approximately random), Streaming and LitData shuffle the whole data set.
"""
from __future__ import annotations

import glob
import os

from dlpack_io.tools.bench.work import collate, sample_work

SHUFFLE_BUFFER = 1000


class _Apply:
    """Picklable sample -> (CHW, label) for WebDataset's .map."""

    def __init__(self, mode: str):
        self.mode, self.key = mode, "jpg" if mode == "jpeg" else "rgb"

    def __call__(self, sample):
        return sample_work(self.mode)(sample[self.key]), int(sample["cls"])


class _Epochs:
    """A DataLoader made once; each call is one epoch (set_epoch where the dataset has it)."""

    def __init__(self, loader, dataset=None):
        self.loader, self.dataset = loader, dataset

    def __call__(self, epoch: int):
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        return iter(self.loader)


def webdataset(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """wds.WebDataset(shardshuffle) -> shuffle(1000) -> map(work) -> batched, in a DataLoader."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    urls = sorted(glob.glob(os.path.join(store, "shard-*.tar")))
    split = wds.split_by_worker if workers > 0 else (lambda src: src)
    dataset = (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, nodesplitter=None,
                              workersplitter=split, empty_check=False)
               .shuffle(SHUFFLE_BUFFER).map(_Apply(mode)).batched(batch_size, collation_fn=collate))
    loader = DataLoader(dataset, batch_size=None, num_workers=workers,
                        persistent_workers=workers > 0)
    return _Epochs(loader)


def _streaming_class():
    from dlpack_io.tools.bench.peers import import_streaming

    streaming = import_streaming()

    class WorkedStreaming(streaming.StreamingDataset):
        """StreamingDataset whose samples get the shared work."""

        def __init__(self, *, mode: str, **kwargs):
            super().__init__(**kwargs)
            self.work = sample_work(mode)

        def __getitem__(self, idx):
            item = super().__getitem__(idx)
            return self.work(item["data"]), int(item["cls"])

    return WorkedStreaming


def streaming(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """streaming.StreamingDataset(shuffle=True) over a private hard-linked copy of the MDS."""
    from torch.utils.data import DataLoader

    from dlpack_io.tools.bench.peers import import_streaming

    local = _private_copy(os.path.join(store, "mds"), f"w{workers}-b{batch_size}-{os.getpid()}")
    import_streaming().base.util.clean_stale_shared_memory()
    dataset = _streaming_class()(mode=mode, local=local, shuffle=True, shuffle_seed=seed,
                                 batch_size=batch_size)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                        collate_fn=collate, persistent_workers=workers > 0)
    return _Epochs(loader, dataset)


def _private_copy(src: str, tag: str) -> str:
    """Hard-link a store into its own folder: one MDS copy per loader configuration."""
    dst = f"{src}-{tag}"
    if not os.path.exists(dst):
        os.makedirs(dst)
        for name in os.listdir(src):
            os.link(os.path.join(src, name), os.path.join(dst, name))
    return dst


def _litdata_class():
    import litdata

    class WorkedLitData(litdata.StreamingDataset):
        """LitData StreamingDataset whose samples get the shared work."""

        def __init__(self, *, mode: str, **kwargs):
            super().__init__(**kwargs)
            self.work = sample_work(mode)

        def __getitem__(self, index):
            item = super().__getitem__(index)
            return self.work(item["data"]), int(item["cls"])

    return WorkedLitData


def litdata(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """litdata.StreamingDataset(shuffle=True) + litdata.StreamingDataLoader."""
    import litdata as ld

    dataset = _litdata_class()(mode=mode, input_dir=os.path.abspath(os.path.join(store, "litdata")),
                               shuffle=True, seed=seed)
    loader = ld.StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                    collate_fn=collate, persistent_workers=workers > 0)
    return _Epochs(loader, dataset)


