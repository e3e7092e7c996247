"""Argument checks shared by the kernel launchers and the torch references.

Every check runs before anything is launched and raises ``TypeError`` (wrong kind of
object or dtype) or ``ValueError`` (wrong shape, length, device, layout or value) with a
message naming the operation, the argument, the value and what was expected.
"""

from __future__ import annotations

import numbers
from typing import NoReturn, Sequence

import torch

from dlpack_io.kernels.records import RECORD_WORDS

OUT_DTYPES = (torch.uint8, torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
FLAG_DTYPES = (torch.bool, torch.uint8)
INT32_MAX = 2**31 - 1


def fail(op: str, message: str, exc: type[Exception] = ValueError) -> NoReturn:
    """Raise ``exc`` with the message prefixed by the operation name."""
    raise exc(f"{op}: {message}")


def check_tensor(op: str, name: str, value: object) -> torch.Tensor:
    """Return ``value`` if it is a tensor, else raise TypeError naming ``name``."""
    if not isinstance(value, torch.Tensor):
        fail(op, f"{name} must be a torch.Tensor, got {type(value).__name__}", TypeError)
    return value


def check_int(op: str, name: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` as an int >= ``minimum`` (bools and floats are rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(op, f"{name} must be an int, got {value!r} ({type(value).__name__})", TypeError)
    if value < minimum:
        fail(op, f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_out_size(op: str, out_size: object) -> tuple[int, int]:
    """Normalise ``out_size`` (an int or an (h, w) pair) to ``(h, w)``."""
    if isinstance(out_size, (tuple, list)):
        if len(out_size) != 2:
            fail(op, f"out_size must be an int or an (h, w) pair, got {out_size!r}")
        return check_int(op, "out_size[0]", out_size[0]), check_int(op, "out_size[1]", out_size[1])
    size = check_int(op, "out_size", out_size)
    return size, size


def check_images(op: str, images: object) -> tuple[int, int, int, int]:
    """Check a dense NHWC uint8 batch and return ``(N, H, W, C)``."""
    images = check_tensor(op, "images", images)
    if images.dtype != torch.uint8:
        fail(op, f"images must be uint8, got {images.dtype}", TypeError)
    if images.dim() != 4:
        fail(op, f"images must be a 4-D NHWC batch, got shape {tuple(images.shape)}")
    n, h, w, c = images.shape
    if not 1 <= c <= 4:
        fail(op, f"images must have 1..4 channels (NHWC, last dim), got shape {tuple(images.shape)}")
    if h < 1 or w < 1:
        fail(op, f"images must have height and width >= 1, got shape {tuple(images.shape)}")
    if not images.is_contiguous():
        fail(op, f"images must be contiguous NHWC (strides {images.stride()}); "
                 "call .contiguous() first")
    if h * w * c > INT32_MAX:
        fail(op, f"one image of shape {(h, w, c)} exceeds 2**31 - 1 bytes")
    return n, h, w, c


def check_flat(op: str, data: object) -> int:
    """Check a flat ragged uint8 buffer and return its length in bytes."""
    data = check_tensor(op, "images", data)
    if data.dtype != torch.uint8:
        fail(op, f"images must be uint8, got {data.dtype}", TypeError)
    if data.dim() != 1:
        fail(op, "with offsets=, images must be one flat 1-D uint8 buffer, "
                 f"got shape {tuple(data.shape)}")
    if not data.is_contiguous():
        fail(op, "images must be contiguous; call .contiguous() first")
    return data.numel()


def check_device(op: str, name: str, value: torch.Tensor, device: torch.device) -> None:
    """Raise unless ``value`` lives on ``device`` (the device of ``images``)."""
    if value.device != device:
        fail(op, f"{name} is on {value.device} but images is on {device}; "
                 f"move it with .to({str(device)!r})")


def check_vector(op: str, name: str, value: object, n: int, device: torch.device,
                 dtypes: Sequence[torch.dtype]) -> torch.Tensor:
    """Check a per-sample 1-D tensor of length ``n``; return it contiguous."""
    value = check_tensor(op, name, value)
    if value.dtype not in dtypes:
        fail(op, f"{name} must have dtype in {[str(d) for d in dtypes]}, got {value.dtype}",
             TypeError)
    if value.dim() != 1 or value.shape[0] != n:
        fail(op, f"{name} must have shape ({n},) (one entry per sample), "
                 f"got {tuple(value.shape)}")
    check_device(op, name, value, device)
    return value.contiguous()


def check_flags(op: str, name: str, value: object, n: int, device: torch.device) -> torch.Tensor:
    """Per-sample flip flags (bool/uint8 tensor, or a Python bool for all) as uint8."""
    if isinstance(value, bool):
        return torch.full((n,), int(value), dtype=torch.uint8, device=device)
    flags = check_vector(op, name, value, n, device, FLAG_DTYPES)
    return flags.view(torch.uint8) if flags.dtype == torch.bool else flags


def check_boxes(op: str, boxes: object, n: int, device: torch.device) -> torch.Tensor:
    """Check an (N, 4) int tensor of (top, left, height, width); return it contiguous."""
    boxes = check_tensor(op, "boxes", boxes)
    if boxes.dtype not in INDEX_DTYPES:
        fail(op, f"boxes must be int32 or int64, got {boxes.dtype}", TypeError)
    if boxes.dim() != 2 or boxes.shape[1] != 4 or boxes.shape[0] != n:
        fail(op, f"boxes must have shape ({n}, 4) of (top, left, height, width), "
                 f"got {tuple(boxes.shape)}")
    check_device(op, "boxes", boxes, device)
    return boxes.contiguous()


def check_records(op: str, records: object, n, device: torch.device) -> torch.Tensor:
    """Check an (N, 16) int32 records tensor (``records.py``); ``n`` None: any N."""
    records = check_tensor(op, "records", records)
    if records.dtype != torch.int32:
        fail(op, f"records must be int32 (see dlpack_io.kernels.records.records_view), "
                 f"got {records.dtype}", TypeError)
    rows = records.shape[0] if records.dim() == 2 and n is None else n
    if records.dim() != 2 or records.shape != (rows, RECORD_WORDS):
        fail(op, f"records must have shape ({'N' if n is None else n}, {RECORD_WORDS}), "
                 f"got {tuple(records.shape)}")
    if not records.is_contiguous():
        fail(op, "records must be contiguous (one 64-byte record per sample)")
    check_device(op, "records", records, device)
    if records.numel() and records.data_ptr() % 8:
        fail(op, f"records must start at an 8-byte aligned address, got "
                 f"{records.data_ptr():#x}; place them at an offset that is a multiple of 8")
    return records


class DeferredChecks:
    """Data-dependent checks, evaluated together with one device->host read.

    ``add(bad, describe)`` registers a bool vector (True = sample is bad) and a function
    building the message for the first bad sample; ``run()`` raises ValueError for the
    first registered check that has a bad sample. On CUDA, ``run()`` costs one
    synchronisation (two when it raises). Disabled (``validate=False`` or an empty batch),
    both are no-ops.
    """

    def __init__(self, op: str, enabled: bool) -> None:
        self.op = op
        self.enabled = enabled
        self._items: list = []

    def add(self, bad_fn, describe) -> None:
        """Register ``bad_fn()`` (called only when enabled) and its message builder."""
        if self.enabled:
            self._items.append((bad_fn(), describe))

    def run(self) -> None:
        """Raise for the first failing check, if any."""
        if not self._items:
            return
        hits = torch.stack([bad.any() for bad, _ in self._items]).tolist()
        for (bad, describe), hit in zip(self._items, hits):
            if hit:
                fail(self.op, describe(int(torch.nonzero(bad)[0, 0])))
