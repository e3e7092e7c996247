"""The finish stage: a built batch -> ``(images, labels)`` on the Loader's device.

The last of the batch path's four stages (order -> plan -> build -> **finish**), run in the
consumer thread (CUDA is touched only here). A finisher takes the workers' HostBatch:

* :class:`DeviceFinisher` (transforms on the device): one host->device copy of the gathered
  bytes on a side stream, then one fused kernel (``dlpack_io.kernels``: crop / resized crop,
  flips, HWC->CHW, colour jitter, normalisation, cast) on the caller's current stream, which
  waits on the copy's event. The Loader *stages* batch k+1 (starts its copy) before it
  yields batch k, so the copy overlaps the training step.
* :class:`HostFinisher` (transforms done on the host): the finished batch as it is, or for a
  CUDA device one non_blocking copy from pinned memory on the side stream, staged the same way.

Both keep a host buffer until the copy that reads it has completed (``reclaim``), then give
it back (``HostBatch.release``). Then :class:`BatchFinish` applies what acts on a delivered
batch rather than on one sample: RandomErasing on the device path (the host path erases in
the workers) and MixUp / CutMix (always here, on the batch's device, as torchvision's
reference script mixes after its DataLoader). What the Loader yields besides the images and
labels (fields, targets that follow the geometry, padding sizes, indices) is fields.py's.

The host batch tensors a released batch leaves behind are recycled here too (:class:`BufferPool`:
the build stage takes them, and a batch returns to the pool once nothing references it).
"""
from __future__ import annotations

import collections
import logging
import sys
import threading

import numpy as np

from dlpack_io.reader.batch.plan import Draws

log = logging.getLogger(__name__)


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
    kw = dict(spec.epilogue, validate=validate,
              jitter=spec.jitter.names if spec.jitter is not None else ())
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


# ---- batch-level transforms, and where the transforms run ----------------------------
def kernel_cannot(spec) -> str | None:
    """Why the GPU kernels cannot finish batches of ``spec`` (None when they can)."""
    if spec.sample_ops:
        return (f"{type(spec.sample_ops[0]).__name__} runs per sample on the host (the GPU "
                f"kernels do not have its ops)")
    if spec.pad:
        return "pad=True makes each image at its own size (the GPU kernels write one size)"
    mode, _ = spec.resample
    if mode != "bilinear":
        return (f"interpolation={mode!r}: the GPU kernel resamples bilinearly (with or "
                f"without antialias) only")
    return None


def place_transforms(spec, on_device: bool, asked) -> bool:
    """Whether the transforms run on the device: ``on_device`` unless the kernels cannot do
    ``spec``; then host transforms (logged), or an error when ``device_transforms=True``
    was asked for explicitly."""
    reason = kernel_cannot(spec) if on_device else None
    if reason is None:
        return on_device
    if asked:
        raise ValueError(f"device_transforms=True, but {reason}: pass device_transforms=None "
                         f"(host transforms, then one copy)")
    log.info("Loader: %s; transforming on the host and copying finished batches", reason)
    return False


class BatchFinish:
    """Erasing (device path only) and mixing of each delivered batch."""

    def __init__(self, spec, seed: int, num_classes: int, device_transforms: bool):
        self.spec, self.seed = spec, int(seed)
        self.erase_here = device_transforms and spec.erasing is not None
        self.num_classes = next((m.num_classes for m in spec.mixes
                                 if m.num_classes is not None), int(num_classes))
        if spec.mixes and self.num_classes < 1:
            raise ValueError("MixUp/CutMix: the data set lists no classes; pass "
                             "num_classes=N to MixUp / CutMix")

    @property
    def active(self) -> bool:
        """True when there is anything to do."""
        return self.erase_here or bool(self.spec.mixes)

    def __call__(self, images, labels, indices, epoch: int, key: int):
        """(images, labels) after erasing / mixing; ``key`` is the batch's first planned
        sample index (what its mixing draw is a function of, with seed and epoch)."""
        draws = Draws(self.seed, epoch)
        if self.erase_here:
            self.spec.erasing.apply(draws, np.asarray(indices), images)
        if self.spec.mixes and len(labels):
            from dlpack_io.reader.transforms.mixing import mix_batch

            images, labels = mix_batch(self.spec.mixes, draws, key, images, labels,
                                       self.num_classes)
        return images, labels


# ---- DataLoader's pin_memory for batches delivered on the CPU ---------------------------
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


# ---- recycled batch tensors ----------------------------------------------------------------
# A fresh 38 MB batch tensor costs ~10k page faults (first touch of every page), which on
# small machines takes as long as filling it. The pool hands out tensors, keeps a reference,
# and takes one back for a new batch only when neither the tensor object nor its storage is
# referenced anywhere else (no user variable, view, numpy array or pinned copy), so a batch
# the training loop keeps is never overwritten. Recycling needs torch's storage use count
# (torch._C._storage_Use_Count); without it the pool simply allocates. At most ``capacity``
# buffers are kept, so memory stays bounded.
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
