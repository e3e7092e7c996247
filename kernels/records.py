"""Per-sample records: one fixed-size block per sample that carries everything a kernel
reads about that sample (box, flips, ragged geometry, colour-jitter factors and order) plus
its label, so that one host->device copy of one pinned buffer moves a whole batch.

Layout (little-endian, 64 bytes = 16 int32 words per sample, 8-byte aligned at least):

=====  ==========  =======  =========================================================
word   field       type     meaning
=====  ==========  =======  =========================================================
0      top         int32    box top row in the sample's image
1      left        int32    box left column
2      box_height  int32    box height (``crop_flip_permute``: ignored, the crop size
                            is the op's height/width)
3      box_width   int32    box width
4      flags       int32    bit 0: flip left-right; bit 1: flip upside-down
5      order       int32    colour-jitter order code (:func:`encode_order`)
6      height      int32    ragged: the sample image's height (dense: ignored)
7      width       int32    ragged: its width
8-9    offset      int64    ragged: byte offset of the image in the data buffer
10-11  label       int64    not read by the kernels; carried for the caller
12     brightness  float32  factors of the enabled jitter ops (others ignored)
13     contrast    float32
14     saturation  float32
15     hue         float32
=====  ==========  =======  =========================================================

Host side: ``rec = np.frombuffer(slot, RECORD_DTYPE, count=n, offset=off)`` (or
:func:`host_records`) and assign fields column-wise; device side: :func:`records_view`
turns the copied buffer region into the ``(N, 16)`` int32 tensor the ``*_packed`` ops take,
and :func:`labels_of` gives the labels as an int64 view of the same memory.
"""

from __future__ import annotations

import numpy as np
import torch

RECORD_BYTES = 64
RECORD_WORDS = RECORD_BYTES // 4
RECORD_ALIGN = 8      # required (the int64 offset and label words)
RECORD_PLACEMENT = 16  # where the Loader puts them: Triton specialises pointers on 16-byte
#                        alignment, so 16 keeps one compiled variant per configuration
RECORD_DTYPE = np.dtype([
    ("top", "<i4"), ("left", "<i4"), ("box_height", "<i4"), ("box_width", "<i4"),
    ("flags", "<i4"), ("order", "<i4"), ("height", "<i4"), ("width", "<i4"),
    ("offset", "<i8"), ("label", "<i8"),
    ("brightness", "<f4"), ("contrast", "<f4"), ("saturation", "<f4"), ("hue", "<f4"),
])

FLIP_H, FLIP_V = 1, 2
#: Column (int32 word) of each field in the (N, 16) int32 view.
WORD = {name: RECORD_DTYPE.fields[name][1] // 4 for name in RECORD_DTYPE.names}
#: torchvision's ColorJitter op ids (``fn_idx``): 0 brightness, 1 contrast, 2 saturation, 3 hue.
JITTER_OPS = ("brightness", "contrast", "saturation", "hue")
NEUTRAL_FACTORS = (1.0, 1.0, 1.0, 0.0)  # per JITTER_OPS: the factor that leaves pixels as they are
#: brightness, contrast, saturation, hue: torchvision's own order, the default.
IDENTITY_ORDER = 0 | 1 << 2 | 2 << 4 | 3 << 6
#: Bit offset of step k's op id in an order code (2 bits per step).
ORDER_SHIFTS = (0, 2, 4, 6)


def encode_order(perms) -> torch.Tensor:
    """``(N, 4)`` permutations of the op ids 0..3 (torchvision ``fn_idx``, one row per
    sample, applied left to right) -> ``(N,)`` int32 codes ``sum(perm[k] << 2k)``."""
    perms = torch.as_tensor(perms)
    if perms.dim() != 2 or perms.shape[1] != 4:
        raise ValueError(f"encode_order: expected an (N, 4) tensor of permutations of 0..3, "
                         f"got shape {tuple(perms.shape)}")
    if perms.numel() and not bool((perms.sort(1).values == torch.arange(4)).all()):
        raise ValueError("encode_order: every row must be a permutation of 0, 1, 2, 3 "
                         "(0 brightness, 1 contrast, 2 saturation, 3 hue)")
    shifts = torch.tensor(ORDER_SHIFTS)
    return (perms.long() << shifts).sum(1).to(torch.int32)


def decode_order(codes: torch.Tensor) -> torch.Tensor:
    """``(N,)`` order codes -> ``(N, 4)`` int64 op ids, step by step."""
    return (codes.long()[:, None] >> torch.tensor(ORDER_SHIFTS, device=codes.device)) & 3


def valid_order(codes: torch.Tensor) -> torch.Tensor:
    """Bool ``(N,)``: the code is in 0..255 and its four fields are a permutation."""
    fields = decode_order(codes)
    in_range = (codes >= 0) & (codes <= 255)
    return in_range & (fields.sort(1).values == torch.arange(4, device=codes.device)).all(1)


def host_records(buffer, offset: int, n: int) -> np.ndarray:
    """A structured numpy view (``RECORD_DTYPE``) of ``n`` records at byte ``offset`` of a
    writable host buffer (numpy array, memoryview, or a CPU uint8 tensor), zero-copy."""
    if isinstance(buffer, torch.Tensor):
        buffer = buffer.numpy()
    raw = np.frombuffer(buffer, dtype=np.uint8) if not isinstance(buffer, np.ndarray) else buffer
    raw = raw.reshape(-1).view(np.uint8)
    _check_region("host_records", raw.size, raw.ctypes.data + offset, offset, n)
    return raw[offset:offset + n * RECORD_BYTES].view(RECORD_DTYPE)


def records_view(buffer: torch.Tensor, offset: int, n: int) -> torch.Tensor:
    """The ``(n, 16)`` int32 view of ``n`` records at byte ``offset`` of a flat uint8 tensor
    (e.g. the device copy of a pinned slot); what the ``*_packed`` ops take."""
    if not isinstance(buffer, torch.Tensor) or buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise TypeError("records_view: buffer must be a 1-D uint8 tensor, got "
                        f"{type(buffer).__name__} {getattr(buffer, 'dtype', '')}")
    if not buffer.is_contiguous():
        raise ValueError("records_view: buffer must be contiguous")
    _check_region("records_view", buffer.numel(), buffer.data_ptr() + offset, offset, n)
    return buffer[offset:offset + n * RECORD_BYTES].view(torch.int32).view(n, RECORD_WORDS)


def labels_of(records: torch.Tensor) -> torch.Tensor:
    """The ``(N,)`` int64 labels of an ``(N, 16)`` int32 records tensor (a view)."""
    return records.view(torch.int64)[:, WORD["label"] // 2]


def _check_region(op: str, size: int, address: int, offset: int, n: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"{op}: offset must be an int >= 0, got {offset!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{op}: n must be an int >= 0, got {n!r}")
    if address % RECORD_ALIGN:
        raise ValueError(f"{op}: records must start at an {RECORD_ALIGN}-byte aligned address; "
                         f"offset {offset} gives address {address:#x}; round the offset up")
    if offset + n * RECORD_BYTES > size:
        raise ValueError(f"{op}: {n} records of {RECORD_BYTES} bytes at offset {offset} end at "
                         f"byte {offset + n * RECORD_BYTES}, past the {size}-byte buffer")
