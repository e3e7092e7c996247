"""What a script written for torch's DataLoader finds on a Loader: DataLoader's attribute
names, the refusal of DataLoader keywords that have no meaning here (pointing to what does
the job), and ``pin_memory`` for batches delivered on the CPU.

Kept apart from loader.py so that the Loader reads as the data path it is.
"""
from __future__ import annotations

import difflib
import logging

log = logging.getLogger(__name__)

# DataLoader keyword -> what to pass to Loader instead (why it has no direct meaning here)
DATALOADER_ONLY = {
    "sampler": "indices=[...] (the global sample indices to read; the order is then shuffled "
               "by shuffle= and seed=, and split across ranks by the Loader itself)",
    "batch_sampler": "batch_size= with indices= (batches are planned by the Loader, a pure "
                     "function of seed, epoch, rank and world size)",
    "collate_fn": "sample_transform= for per-sample code, or your own code on the yielded "
                  "tensors (a batch is built in one buffer, never collated from a list of "
                  "samples)",
    "worker_init_fn": "sample_transform= for per-sample code in the workers (set up what it "
                      "needs lazily, on its first call in each worker)",
    "generator": "seed= (the order and the random transforms are a pure function of seed and "
                 "epoch)",
    "multiprocessing_context": "worker_kind='process' (workers are forked or spawned by the "
                               "Loader) or worker_kind='thread' (the default)",
    "pin_memory_device": "device='cuda:N' (batches are delivered on that device)",
    "in_order": "nothing: batches always come in order",
}


def refuse_dataloader_only(given: dict, known) -> None:
    """Raise TypeError for keywords a Loader does not take: for DataLoader's, name what to
    pass instead; for others, say so as Python would, with the closest option names."""
    for name in given:
        if name in DATALOADER_ONLY:
            raise TypeError(f"Loader() does not take DataLoader's {name}=: use "
                            f"{DATALOADER_ONLY[name]} (docs/loader.md, 'Coming from "
                            f"DataLoader')")
        close = difflib.get_close_matches(name, list(known), n=2)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise TypeError(f"Loader() got an unexpected keyword argument {name!r}{hint}")


def check_prefetch(prefetch, prefetch_factor) -> None:
    """``prefetch`` (batches in flight) and DataLoader's ``prefetch_factor`` (per worker)
    say the same thing: one of them, each at least 1."""
    if prefetch_factor is None:
        return
    if prefetch is not None:
        raise ValueError(f"prefetch={prefetch} and prefetch_factor={prefetch_factor}: pass one "
                         f"(prefetch counts batches in flight in all, prefetch_factor per "
                         f"worker, as DataLoader's)")
    if int(prefetch_factor) < 1:
        raise ValueError(f"prefetch_factor {prefetch_factor}: expected >= 1 batches per worker")


def pin_ok(pin_memory: bool, device) -> bool:
    """Whether CPU batches are to be pinned: asked for, delivered on the CPU, and CUDA
    present (without it, as DataLoader, a warning and unpinned batches)."""
    if not pin_memory or device.type != "cpu":
        return False  # CUDA batches: the host side is pinned already, the result is on the GPU
    import torch

    if not torch.cuda.is_available():
        log.warning("Loader: pin_memory=True but CUDA is not available here: batches are "
                    "delivered in ordinary (unpinned) memory")
        return False
    return True


def pinned(batch: tuple) -> tuple:
    """``batch`` with every CPU tensor in page-locked memory (those already pinned as they
    are), so the training loop's ``.to('cuda', non_blocking=True)`` is a true async copy."""
    import torch

    return tuple(t.pin_memory() if torch.is_tensor(t) and not t.is_pinned() else t
                 for t in batch)


class DataLoaderAttributes:
    """DataLoader's read-only attributes, from the Loader's ``options``."""

    options = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def batch_size(self) -> int:
        """Samples per batch (the last batch of a rank may hold fewer unless drop_last)."""
        return self.options.batch_size

    @property
    def num_workers(self) -> int:
        """Worker threads or processes (0: batches are built in the calling thread)."""
        return self.options.num_workers

    @property
    def drop_last(self) -> bool:
        """Whether each rank's short last batch is dropped."""
        return bool(self.options.drop_last)

    @property
    def pin_memory(self) -> bool:
        """Whether CPU batches are delivered in pinned memory (as asked)."""
        return bool(self.options.pin_memory)

    @property
    def prefetch_factor(self) -> int | None:
        """Batches in flight per worker, as asked (None: ``prefetch`` or its default)."""
        return self.options.prefetch_factor

    @property
    def persistent_workers(self) -> bool:
        """Whether workers are kept from one epoch to the next."""
        return bool(self.options.persistent_workers)
