"""Reusable batch buffers: recycle a batch tensor once nobody holds it any more.

A fresh 38 MB batch tensor costs ~10k page faults (first touch of every page), which on
small machines takes as long as filling it. The pool hands out tensors, keeps a
reference, and takes one back for a new batch only when neither the tensor object nor
its storage is referenced anywhere else (no user variable, view, numpy array or pinned
copy), so a batch the training loop keeps is never overwritten. Recycling needs torch's
storage use count (``torch._C._storage_Use_Count``); without it the pool simply
allocates. At most ``capacity`` buffers are kept, so memory stays bounded.
"""
from __future__ import annotations

import logging
import queue
import sys
import threading

import numpy as np

log = logging.getLogger(__name__)


def _use_count(t) -> int:
    import torch

    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _counts_at(items: list, i: int) -> tuple[int, int]:
    """(Python refcount, storage use count) of items[i]; the caller must not bind it."""
    return sys.getrefcount(items[i]), _use_count(items[i])


def _baseline():
    """The counts of a tensor referenced by nothing but one pool list."""
    import torch

    try:
        return _counts_at([torch.empty(1)], 0)
    except Exception as exc:  # private torch API missing: never recycle
        log.debug("batch buffer recycling disabled: %s", exc)
        return None


class BufferPool:
    """Hands out (optionally pinned) tensors of a given shape and dtype, recycling free ones."""

    def __init__(self, capacity: int = 8, pin_memory: bool = False):
        self.capacity = max(int(capacity), 1)
        self.pin_memory = pin_memory
        self._held = []
        self._lock = threading.Lock()
        self._free_counts = _baseline()

    def _free_index(self, shape, dtype) -> int:
        held = self._held
        for i in range(len(held)):
            if held[i].shape == shape and held[i].dtype == dtype \
                    and self._free_counts is not None and _counts_at(held, i) == self._free_counts:
                return i
        return -1

    def take(self, shape, dtype):
        """A tensor of ``shape`` and ``dtype`` that no one else references."""
        import torch

        shape = torch.Size(int(s) for s in shape)
        with self._lock:
            i = self._free_index(shape, dtype)
            if i >= 0:
                self._held.append(self._held.pop(i))
                return self._held[-1]
            if len(self._held) >= self.capacity:
                self._held.pop(0)  # forget the oldest: freed when its holder drops it
        t = torch.empty(shape, dtype=dtype, pin_memory=self.pin_memory)
        with self._lock:
            self._held.append(t)
        return t

    def clear(self) -> None:
        """Drop every reference the pool holds."""
        with self._lock:
            self._held.clear()


class SlotPool:
    """``n`` reusable flat uint8 host buffers (pinned for CUDA), grown on demand, handed out
    blocking: at most ``n`` batches are gathered or in flight to the device at once, which
    bounds the pinned memory a loader holds (n x the largest batch)."""

    def __init__(self, n: int, pin: bool):
        self.pin = pin
        self._tensors = [None] * n
        self._free = queue.SimpleQueue()
        for i in range(n):
            self._free.put(i)

    def acquire(self, nbytes: int) -> int:
        """A free slot of at least ``nbytes`` bytes (blocks until one is released)."""
        import torch

        i = self._free.get()
        t = self._tensors[i]
        if t is None or t.numel() < nbytes:
            self._tensors[i] = None  # free the old one before allocating the larger one
            self._tensors[i] = torch.empty(max(nbytes * 5 // 4, 1), dtype=torch.uint8,
                                           pin_memory=self.pin)
        return i

    def tensor(self, i: int):
        """Slot ``i`` as a flat uint8 tensor."""
        return self._tensors[i]

    def array(self, i: int) -> np.ndarray:
        """Slot ``i`` as a flat uint8 numpy array (shares memory)."""
        return self._tensors[i].numpy()

    def release(self, i: int) -> None:
        """Give slot ``i`` back."""
        self._free.put(i)

    def nbytes(self) -> int:
        """Bytes held by the slots allocated so far."""
        return sum(t.numel() for t in self._tensors if t is not None)
