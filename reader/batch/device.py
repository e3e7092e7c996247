"""How a batch is finished for the training loop: on the device, or handed over from the host.

The third step of the batch path (after :mod:`batchplan` and :mod:`hostbuild`). A finisher
takes the workers' HostBatch and returns ``(images, labels)`` on the Loader's device:

* :class:`DeviceFinisher` (transforms on the device): one host->device copy of the gathered
  bytes on a side stream, then one fused kernel (``dlpack_io.kernels``: crop / resized crop,
  flips, HWC->CHW, colour jitter, normalisation, cast) on the caller's current stream, which
  waits on the copy's event. The Loader *stages* batch k+1 (starts its copy) before it
  yields batch k, so the copy overlaps the training step.
* :class:`HostFinisher` (transforms done on the host): the finished batch as it is, or for a
  CUDA device one non_blocking copy from pinned memory on the side stream, staged the same way.

Both keep a host buffer until the copy that reads it has completed (``reclaim``), then give
it back (``HostBatch.release``). CUDA is touched only here, in the consumer thread.
"""
from __future__ import annotations

import collections

import numpy as np


def run_kernel(meta, data, spec, *, validate: bool):
    """The fused kernel over a gathered batch ``data`` (the copied buffer on its device:
    pixels, then the per-sample records); returns (images, labels) on that device."""
    import torch

    from dlpack_io import kernels
    from dlpack_io.kernels import records

    n = len(meta.labels)
    if not n:  # every sample skipped (on_error="skip")
        empty = torch.empty((0, 3, *meta.out_size), dtype=spec.dtype, device=data.device)
        return empty, torch.empty(0, dtype=torch.int64, device=data.device)
    recs = records.records_view(data, meta.records_offset, n)
    kw = dict(out_dtype=spec.dtype, validate=validate,
              jitter=tuple(name for name, r in zip(records.JITTER_OPS, spec.jitter.ranges)
                           if r is not None) if spec.jitter is not None else ())
    if spec.normalize is not None:
        kw["mean"], kw["std"] = spec.normalize.mean, spec.normalize.std
    if meta.dense_shape is not None:
        images = data[:meta.records_offset].view(-1)[:int(np.prod(meta.dense_shape))]
        images = images.view(meta.dense_shape)
        if not meta.resize:
            out = kernels.crop_flip_permute_packed(images, recs, *meta.out_size, **kw)
        else:
            out = kernels.resized_crop_packed(images, recs, meta.out_size,
                                              antialias=spec.resample[1], **kw)
    else:
        out = kernels.resized_crop_packed(data, recs, meta.out_size, channels=3,
                                          antialias=spec.resample[1], **kw)
    return out, records.labels_of(recs).contiguous()


class _Copies:
    """Side-stream host->device copies: staged ahead, waited for on the current stream,
    their host buffers released once the copy has completed."""

    def __init__(self, device):
        import torch

        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._staged = {}                      # id(HostBatch) -> (tensors, event)
        self._pending = collections.deque()    # (event, release) of copies in flight

    def stage(self, key, hb, tensors) -> None:
        """Start copying ``tensors`` (host) to the device; remembered under ``key``."""
        import torch

        if key in self._staged:
            return
        if not self.cuda:
            self._staged[key] = (tensors, None)
            return
        with torch.cuda.stream(self.stream):
            moved = [t.to(self.device, non_blocking=True) for t in tensors]
            event = torch.cuda.Event()
            event.record(self.stream)
        self._staged[key] = (moved, event)

    def take(self, key):
        """(device tensors, event) staged under ``key``, usable on the current stream."""
        import torch

        tensors, event = self._staged.pop(key)
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for t in tensors:
                t.record_stream(current)
        return tensors, event

    def done_with(self, event, release) -> None:
        """Run ``release`` once the copy behind ``event`` has completed (at once on the CPU,
        where the caller has finished reading the host tensors)."""
        if event is None:
            release()
        else:
            self._pending.append((event, release))

    def reclaim(self, block: bool = False) -> None:
        """Release host buffers whose copies have finished (all of them with ``block``)."""
        while self._pending and (block or self._pending[0][0].query()):
            event, release = self._pending.popleft()
            event.synchronize()
            release()

    def close(self) -> None:
        """Wait for every copy in flight (staged ones too) and release its buffer."""
        self.reclaim(block=True)
        for _, event in self._staged.values():
            if event is not None:  # a staged copy may still read its pinned host slot,
                event.synchronize()  # which the caller unpins / unmaps next
        self._staged.clear()


def pin_host_memory(buffers) -> list:
    """Register writable host buffers (the process workers' shared slots) as pinned CUDA
    memory, so their copies are true asynchronous DMA; returns what ``unpin`` needs."""
    import ctypes

    import torch

    cudart, pinned = torch.cuda.cudart(), []
    for buf in buffers:
        holder = ctypes.c_char.from_buffer(buf)  # keeps the buffer exported while pinned
        ptr = ctypes.addressof(holder)
        err = cudart.cudaHostRegister(ptr, len(buf), 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of a {len(buf)}-byte loader slot failed "
                               f"(error {int(err)}): lower prefetch or batch_size")
        pinned.append((ptr, holder))
    return pinned


def unpin_host_memory(pinned: list) -> None:
    """Undo :func:`pin_host_memory`."""
    import torch

    cudart = torch.cuda.cudart()
    for ptr, _ in pinned:
        cudart.cudaHostUnregister(ptr)
    pinned.clear()


class DeviceFinisher:
    """Gathered batch -> one copy -> one kernel (see the module doc)."""

    def __init__(self, spec, device):
        self.spec, self.device = spec, device
        self._copies = _Copies(device)
        self._pinned = []

    def pin(self, buffers) -> None:
        """Pin the process workers' shared slots (CUDA only; once)."""
        if self._copies.cuda and not self._pinned:
            self._pinned = pin_host_memory(buffers)

    def stage(self, hb) -> None:
        """Start the one host->device copy of ``hb`` (no-op when it has started)."""
        self._copies.stage(id(hb), hb, [hb.data])

    def finish(self, hb):
        """(images, labels) of ``hb`` on the device; its buffer is released after the copy."""
        self.stage(hb)
        (data,), event = self._copies.take(id(hb))
        images, labels = run_kernel(hb.meta, data, self.spec, validate=not self._copies.cuda)
        self._copies.done_with(event, hb.release)  # on the CPU the kernel has read it by now
        return images, labels

    def reclaim(self, block: bool = False) -> None:
        """Give back the host buffers whose copies are done."""
        self._copies.reclaim(block)

    def close(self) -> None:
        """Finish outstanding copies, release their buffers, unpin the slots."""
        self._copies.close()
        if self._pinned:
            unpin_host_memory(self._pinned)


class HostFinisher:
    """Finished host batch -> the caller (CPU), or one pinned copy to the device."""

    def __init__(self, device):
        self.device = device
        self._copies = _Copies(device)

    def stage(self, hb) -> None:
        """Start the copy of a finished batch to a CUDA device (no-op on the CPU)."""
        import torch

        if self._copies.cuda:
            self._copies.stage(id(hb), hb, [hb.images, torch.from_numpy(hb.labels)])

    def finish(self, hb):
        """(images, labels) of ``hb`` on the Loader's device."""
        import torch

        if not self._copies.cuda:
            hb.release()
            return hb.images, torch.from_numpy(hb.labels)
        self.stage(hb)
        (images, labels), event = self._copies.take(id(hb))
        self._copies.done_with(event, _Keep(hb).release)
        return images, labels

    def reclaim(self, block: bool = False) -> None:
        """Drop host batches whose copies are done (their tensors return to the pool)."""
        self._copies.reclaim(block)

    def close(self) -> None:
        """Finish outstanding copies."""
        self._copies.close()


class _Keep:
    """Holds a host batch (so its pooled tensor is not recycled) until ``release``."""

    def __init__(self, hb):
        self.hb = hb

    def release(self) -> None:
        """Let the batch go (its buffer may be recycled) and run its own release."""
        hb, self.hb = self.hb, None
        if hb is not None:
            hb.release()
