"""What the workers run and what the consumer does with each result, per loader path.

Four combinations of (where transforms run) x (worker kind):
  * CpuJob:       threads / serial fill ranges of samples of a recycled batch tensor.
  * CpuProcJob:   processes write uint8 NCHW pixels into a shared slot; the consumer
                  copies (uint8) or normalises (float) them out into a recycled tensor.
  * DeviceJob:    threads gather records / decoded regions into pinned slots; the
                  consumer copies each slot to the device on a side stream and runs the
                  kernel.
  * DeviceProcJob: like DeviceJob but gathered by processes into shared slots.
Thread jobs offer ``split`` (see workers.py), process jobs ``build``/``finish`` (see
procworkers.py); every ``deliver`` returns ``(images, labels, indices, skipped)``, where
``skipped`` lists the samples ``on_error="skip"`` left out of the batch (skips.py).
"""
from __future__ import annotations

import functools

import numpy as np

from dlpack_io.reader.assemble import Scratch, drop_failed, fill_range, prepare, split_ranges
from dlpack_io.reader.buffers import BufferPool
from dlpack_io.reader.hostbatch import capacity_needed, device_images, fill_host
from dlpack_io.reader.transforms import normalize_into


def _out_dtype(pipe):
    import torch

    return torch.uint8 if pipe.dtype is None else pipe.dtype


def _scratch(state: dict) -> Scratch:
    s = state.get("scratch")
    if s is None:
        s = state["scratch"] = Scratch()
    return s


class CpuJob:
    """CPU transforms in threads: each batch split into ``parts`` ranges of samples."""

    def __init__(self, pipe, pool: BufferPool, parts: int):
        self.pipe, self.pool, self.parts = pipe, pool, max(1, int(parts))

    def _fill(self, prep, a, b, arr, failed, state) -> None:
        fill_range(self.pipe, prep, a, b, arr, _scratch(state), failed=failed)

    def split(self, k: int, indices: np.ndarray, epoch: int):
        """(parts, finalize) of batch ``k``; lookups and random draws happen here."""
        import torch

        prep = prepare(self.pipe, indices, epoch)
        u8 = self.pool.take(prep.shape, torch.uint8)
        arr, failed = u8.numpy(), []  # failed: (position, Skipped) from any thread
        parts = [functools.partial(self._fill, prep, a, b, arr, failed)
                 for a, b in split_ranges(len(prep.indices), self.parts)]

        def finalize():
            m, labels, kept, skipped = drop_failed(prep, arr, failed)
            dtype, shape = _out_dtype(self.pipe), (m, *prep.shape[1:])
            images = u8[:m] if dtype == torch.uint8 else normalize_into(
                u8[:m], self.pool.take(shape, dtype), self.pipe.mean, self.pipe.std)
            return images, torch.from_numpy(labels), kept, skipped
        return parts, finalize

    def deliver(self, result):
        """The threads already finished the batch."""
        return result


class CpuProcJob:
    """CPU transforms in worker processes, uint8 pixels handed over in shared slots."""

    def __init__(self, pipe, pool: BufferPool):
        self.pipe, self.pool = pipe, pool

    def build(self, k, slot, progress, state, indices, epoch):
        """(In a worker) fill the slot with uint8 NCHW pixels; return (shape, labels,
        indices, skipped) of the samples kept."""
        prep = prepare(self.pipe, indices, epoch)
        out = np.frombuffer(slot, dtype=np.uint8, count=int(np.prod(prep.shape)))
        out, failed = out.reshape(prep.shape), []
        fill_range(self.pipe, prep, 0, len(prep.indices), out, _scratch(state), progress, failed)
        m, labels, kept, skipped = drop_failed(prep, out, failed)
        return (m, *prep.shape[1:]), labels, kept, skipped

    def finish(self, k, slot, meta):
        """(In the consumer) copy / normalise the slot into a recycled tensor."""
        import torch

        shape, labels, indices, skipped = meta
        u8 = torch.frombuffer(slot, dtype=torch.uint8, count=max(int(np.prod(shape)), 1))
        u8 = u8[:int(np.prod(shape))].view(shape)
        dtype = _out_dtype(self.pipe)
        out = self.pool.take(shape, dtype)
        if dtype == torch.uint8:
            out.copy_(u8)
        else:
            normalize_into(u8, out, self.pipe.mean, self.pipe.std)
        return out, torch.from_numpy(labels), indices, skipped

    def deliver(self, result):
        """``finish`` already produced the batch."""
        return result


def slot_bytes(pipe, batch_size: int, on_device: bool) -> int:
    """Shared slot size for process workers: a batch of CPU output, or of whole records."""
    if on_device or pipe.crop is None:
        return batch_size * max_record_bytes(pipe)
    return batch_size * 3 * pipe.crop.size[0] * pipe.crop.size[1]


def max_record_bytes(pipe) -> int:
    """Largest full-size record in pixels x 3 (opens every shard's index)."""
    ds = pipe.dataset
    return max(int((s.index["height"].astype(np.int64) * s.index["width"] * 3).max(initial=1))
               for s in ds.shards)


class DeviceJob:
    """Device transforms: worker threads gather into pinned slots; the consumer copies and
    runs the kernel."""

    def __init__(self, pipe, device, num_slots: int):
        import torch

        self.pipe, self.device = pipe, device
        self.cuda = device.type == "cuda"
        self._slots = SlotPool(num_slots, pin=self.cuda)
        self._stream = torch.cuda.Stream(device) if self.cuda else None
        self._pending = []  # (event, slot) copies in flight

    def _gather(self, indices, epoch, out: list, state: dict) -> None:
        _, _, entries = self.pipe.dataset.lookup(indices)
        slot = self._slots.acquire(capacity_needed(entries))
        try:
            out.append(fill_host(self.pipe, indices, epoch, self._slots.array(slot),
                                 _scratch(state)))
        except BaseException:
            self._slots.release(slot)
            raise
        out.insert(0, slot)

    def split(self, k, indices, epoch):
        """One part: gather batch ``k`` into a free slot (in a worker thread)."""
        out = []
        return [functools.partial(self._gather, indices, epoch, out)], lambda: (out[0], out[1])

    def deliver(self, result):
        """(Consumer) copy the slot to the device and run the kernel."""
        import torch

        slot, meta = result
        host = self._slots.tensor(slot)[:meta.nbytes]
        if not self.cuda or not len(meta.indices):
            images = device_images(meta, host, self.pipe, validate=True)
            self._slots.release(slot)
            return images, torch.from_numpy(meta.labels), meta.indices, meta.skipped
        with torch.cuda.stream(self._stream):
            data = host.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        torch.cuda.current_stream(self.device).wait_stream(self._stream)
        data.record_stream(torch.cuda.current_stream(self.device))
        self._pending.append((event, slot))
        images = device_images(meta, data, self.pipe, validate=False)
        labels = torch.from_numpy(meta.labels).to(self.device, non_blocking=True)
        return images, labels, meta.indices, meta.skipped

    def reclaim(self) -> None:
        """Release the slots whose device copies have finished (waits for them)."""
        for event, slot in self._pending:
            event.synchronize()
            self._slots.release(slot)
        self._pending.clear()


class SlotPool:
    """``n`` reusable host buffers (pinned for CUDA), grown on demand, handed out blocking."""

    def __init__(self, n: int, pin: bool):
        import queue

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
            self._tensors[i] = None
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


class DeviceProcJob:
    """Device transforms, records gathered by worker processes into shared slots."""

    def __init__(self, pipe, device):
        self.pipe, self.device = pipe, device

    def build(self, k, slot, progress, state, indices, epoch):
        """(In a worker) gather batch ``k`` into the slot; return its HostMeta."""
        buf = np.frombuffer(slot, dtype=np.uint8)
        return fill_host(self.pipe, indices, epoch, buf, _scratch(state), progress)

    def finish(self, k, slot, meta):
        """(In the consumer) copy the used part of the slot to the device, run the kernel."""
        import torch

        host = torch.frombuffer(slot, dtype=torch.uint8, count=max(meta.nbytes, 1))
        data = host.to(self.device) if self.device.type == "cuda" else host.clone()
        images = device_images(meta, data, self.pipe, validate=self.device.type != "cuda")
        return images, torch.from_numpy(meta.labels).to(self.device), meta.indices, meta.skipped

    def deliver(self, result):
        """``finish`` already produced the batch."""
        return result
