"""The builder of the registry's "ram" section (tools/bench/families.py): our Loader with
its shards mapped, optionally madvise'd."""
from __future__ import annotations

from dlpack_io.reader import Order, Output
from dlpack_io.reader.batch.order import DEFAULT_BLOCK_SIZE, DEFAULT_WINDOW

from benchmarks.larger_than_ram.cache import MADV_RANDOM, advise_mappings, shard_files

ADVICE = {None: 0, "random": MADV_RANDOM}  # ram_loader's ``advice`` -> madvise() advice


def ram_loader(path, mode: str, crop: int, batch_size: int, workers: int, *, shuffle: str,
               block_size: int = DEFAULT_BLOCK_SIZE, block_window: int = DEFAULT_WINDOW,
               advice: str | None = None,
               seed: int = 0):
    """The "ram" section's builder (families.py): a Loader over the data set at ``path``
    (thread workers, uint8 CPU output, ``return_index=True``; jpeg: RandomResizedCrop(crop),
    raw: RandomCrop(crop); + flip) whose shards are already mapped, with madvise ``advice``
    (None: the kernel's default; "random": MADV_RANDOM, no readahead, which the Loader does
    not do itself) on every shard mapping of this process."""
    import numpy as np

    from dlpack_io.reader import Dataset, Loader, RandomCrop, RandomHorizontalFlip, RandomResizedCrop

    if advice not in ADVICE:
        raise ValueError(f"advice={advice!r}: expected one of {sorted(map(str, ADVICE))}")
    resize = (RandomResizedCrop if mode == "jpeg" else RandomCrop)(crop)
    loader = Loader(Dataset(path), batch_size=batch_size, shuffle=shuffle, seed=seed,
                    order=Order(block_size=block_size, block_window=block_window),
                    output=Output(return_index=True), num_workers=workers,
                    transforms=[resize, RandomHorizontalFlip()])
    loader.dataset.lookup(np.arange(len(loader.dataset)))  # maps every shard
    if ADVICE[advice]:
        advise_mappings(shard_files(path), ADVICE[advice])
    return loader


def geometry(family) -> tuple[int, int]:
    """(block_size, block_window) the family's Loader uses (ram_loader's defaults)."""
    return (family.options.get("block_size", DEFAULT_BLOCK_SIZE),
            family.options.get("block_window", DEFAULT_WINDOW))
