"""torch.utils.data.DataLoader over the image files (PIL), one .npy file per sample, our record
shards read record by record, and a plain LMDB of JPEG bytes.

A map-style Dataset per store; DataLoader(shuffle=True, persistent_workers when it has
workers) with the shared collate. DataLoader seeds Python's ``random`` in each worker.
"""
from __future__ import annotations

from dlpack_io.tools.bench.sources import sample


class SourceDataset:
    """Map-style dataset: sample i of a source after the mode's work."""

    def __init__(self, source, mode: str):
        self.source, self.mode = source, mode

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int):
        return sample(self.source, self.mode, i)


class DataLoaderContender:
    """A torch DataLoader made once; each call is one epoch."""

    def __init__(self, dataset, batch_size: int, workers: int, seed: int = 0):
        import torch
        from torch.utils.data import DataLoader

        from dlpack_io.tools.bench.work import collate

        self.generator = torch.Generator().manual_seed(seed)
        self.loader = DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                 num_workers=workers, collate_fn=collate,
                                 persistent_workers=workers > 0, generator=self.generator)

    def __call__(self, epoch: int):
        return iter(self.loader)


def dataloader_files(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """DataLoader over the JPEG files (jpeg) or the raw.npy memmap (raw)."""
    from dlpack_io.tools.bench.sources import FileSource, NumpySource

    source = FileSource(store) if mode == "jpeg" else NumpySource(store)
    return DataLoaderContender(SourceDataset(source, mode), batch_size, workers, seed)


def dataloader_npy(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """DataLoader over one .npy file of 256x256x3 pixels per sample (raw only)."""
    from dlpack_io.tools.bench.sources import NpyFileSource

    return DataLoaderContender(SourceDataset(NpyFileSource(store), mode), batch_size, workers,
                               seed)


def dataloader_ours(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """DataLoader over our record shards (``Dataset.record``), the PIL / numpy work in its
    workers: what our Loader adds over a plain DataLoader on the same data."""
    from dlpack_io.tools.bench.sources import RecordSource

    return DataLoaderContender(SourceDataset(RecordSource(store), mode), batch_size, workers,
                               seed)


def dataloader_lmdb(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """DataLoader over one plain LMDB (JPEG bytes or raw pixels as values)."""
    from dlpack_io.tools.bench.sources import LmdbSource

    return DataLoaderContender(SourceDataset(LmdbSource(store), mode), batch_size, workers, seed)
