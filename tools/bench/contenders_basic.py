"""The classic baselines: a serial numpy loop, and a hand-written multiprocessing loader.

The multiprocessing loader is the common student design: one index queue per worker, batches
dealt round-robin, each worker builds whole batches and sends them through one result queue,
``prefetch`` batches per worker in flight, results re-ordered by batch number.
"""
from __future__ import annotations

import multiprocessing as mp
import random

import numpy as np

from dlpack_io.tools.bench.sources import sample


def _batches(n: int, batch_size: int, seed: int, epoch: int):
    order = np.random.default_rng([seed, epoch]).permutation(n)
    return [order[i:i + batch_size].tolist() for i in range(0, n, batch_size)]


def _make_batch(source, mode, indices, rng):
    items = [sample(source, mode, i, rng) for i in indices]
    images = np.stack([x[0] for x in items])
    return images, np.asarray([x[1] for x in items], dtype=np.int64)


class SerialLoader:
    """One process, one sample at a time: the baseline every speedup is relative to."""

    def __init__(self, source, mode: str, batch_size: int, seed: int = 0):
        self.source, self.mode, self.batch_size, self.seed = source, mode, batch_size, seed

    def __call__(self, epoch: int):
        import torch

        rng = random.Random(self.seed * 1000 + epoch)
        for indices in _batches(len(self.source), self.batch_size, self.seed, epoch):
            images, labels = _make_batch(self.source, self.mode, indices, rng)
            yield torch.from_numpy(images), torch.from_numpy(labels)


def _worker(wid, source, mode, seed, index_q, result_q):
    rng = random.Random(seed * 7919 + wid)
    while True:
        job = index_q.get()
        if job is None:
            return
        batch_id, indices = job
        result_q.put((batch_id, *_make_batch(source, mode, indices, rng)))


class MultiprocessingLoader:
    """Hand-written worker pool: per-worker index queues, prefetch, in-order delivery."""

    def __init__(self, source, mode: str, batch_size: int, workers: int, seed: int = 0,
                 prefetch: int = 2):
        self.source, self.batch_size, self.seed = source, batch_size, seed
        self.workers, self.prefetch = workers, prefetch
        ctx = mp.get_context("fork")
        self.index_qs = [ctx.Queue() for _ in range(workers)]
        self.result_q = ctx.Queue()
        self.procs = [ctx.Process(target=_worker, daemon=True,
                                  args=(w, source, mode, seed, self.index_qs[w], self.result_q))
                      for w in range(workers)]
        for p in self.procs:
            p.start()

    def __call__(self, epoch: int):
        import torch

        jobs = _batches(len(self.source), self.batch_size, self.seed, epoch)
        sent, done, pending = 0, 0, {}
        while done < len(jobs):
            while sent < len(jobs) and sent - done < self.workers * self.prefetch:
                self.index_qs[sent % self.workers].put((sent, jobs[sent]))
                sent += 1
            while done not in pending:
                batch_id, images, labels = self.result_q.get()
                pending[batch_id] = (images, labels)
            images, labels = pending.pop(done)
            done += 1
            yield torch.from_numpy(images), torch.from_numpy(labels)

    def close(self) -> None:
        """Stop the workers."""
        for q in self.index_qs:
            q.put(None)
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()


def serial(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """The serial numpy loop (workers is ignored: always 0)."""
    from dlpack_io.tools.bench.sources import FileSource, NumpySource

    source = FileSource(store) if mode == "jpeg" else NumpySource(store)
    return SerialLoader(source, mode, batch_size, seed)


def multiprocessing(store: str, mode: str, batch_size: int, workers: int, seed: int = 0):
    """The hand-written multiprocessing loader."""
    from dlpack_io.tools.bench.sources import FileSource, NumpySource

    source = FileSource(store) if mode == "jpeg" else NumpySource(store)
    return MultiprocessingLoader(source, mode, batch_size, max(1, workers), seed)
