"""Ours: dlpack_io.reader.Loader over our record shards, thread or process workers."""
from __future__ import annotations
from dlpack_io.reader import Workers


def ours(store: str, mode: str, batch_size: int, workers: int, seed: int = 0, *,
         worker_kind: str = "thread"):
    """Loader(Dataset(store)) doing W_jpeg (RandomResizedCrop) or W_raw (RandomCrop), uint8 CPU."""
    import torch

    from dlpack_io.reader import (Dataset, Loader, RandomCrop, RandomHorizontalFlip,
                                  RandomResizedCrop)

    crop = RandomResizedCrop(224) if mode == "jpeg" else RandomCrop(224)
    loader = Loader(Dataset(store), batch_size=batch_size, shuffle="global", seed=seed,
                    num_workers=workers, workers=Workers(kind=worker_kind), drop_last=False,
                    transforms=[crop, RandomHorizontalFlip()], dtype=torch.uint8, device="cpu")
    return _Epochs(loader)


class _Epochs:
    def __init__(self, loader):
        self.loader = loader

    def __call__(self, epoch: int):
        self.loader.set_epoch(epoch)
        return iter(self.loader)

    def close(self) -> None:
        """Release the loader's workers, where it can."""
        self.loader.close()
