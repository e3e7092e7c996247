"""The Loader's options: one frozen dataclass, one set of defaults, checked once.

Also what the Loader resolves once at construction: the device (an explicit index, else
``LOCAL_RANK``, else the current CUDA device) and the data set plus subset it reads.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass

import numpy as np

from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch.compat import check_prefetch
from dlpack_io.reader.batch.padding import check_pad
from dlpack_io.reader.batch.skips import check_on_error
from dlpack_io.reader.batch.stats import parse_log_every

log = logging.getLogger(__name__)
WORKER_KINDS = ("thread", "process")
MAX_PREFETCH, MAX_WORKERS = 4096, 1024  # beyond these: a typo, not a setting
AUTO = "auto"  # num_workers / prefetch: settled by measuring the first batches (autotune.py)


OPTION_DOCS = """
    Options:

    batch_size: samples per batch.
    shuffle: "global"/True (a full permutation), "block" (shard-local, for data sets
        larger than RAM), False/None/"none" (storage order).
    seed: seeds the order and the random transforms.
    num_workers: worker threads or processes; 0 builds batches in the calling thread;
        "auto": measured on the first batches (count and kind; docs/loader.md).
    drop_last: as torch's DataLoader: True drops each rank's short last batch.
    transforms: the fused transforms (RandomResizedCrop, ..., Normalize), in order.
    sample_transform: your fn(HWC uint8 ndarray) -> HWC uint8 ndarray, run in the workers
        before ``transforms``.
    dtype: torch.uint8 (default) or float16/bfloat16/float32 (float32 with Normalize).
    device: where batches are delivered; "cuda" means cuda:LOCAL_RANK under torchrun.
    indices: read only these global sample indices (a split).
    rank, world_size: this process's share; None: torch.distributed's, else torchrun's.
    prefetch: batches in flight; None: 2 x num_workers (at least 2); "auto": measured.
    worker_kind: "thread" or "process".
    timeout: seconds to wait for one batch before LoaderTimeout; None waits.
    on_error: "raise" a SampleError for an unreadable sample, or "skip" it.
    return_index: also yield each batch's global sample indices.
    device_transforms: None: on the GPU for CUDA, else on the host; False: on the host.
    reduced_decode: decode JPEGs at a reduced DCT scale where a resize allows it.
    block_size, block_window: the geometry of shuffle="block".
    pin_memory, prefetch_factor, persistent_workers: DataLoader's (CPU batches in pinned
        memory; batches in flight per worker; False stops the workers after each epoch).
    fields: what each batch holds, in order: "image", "label" and the data set's fields
        (``ds.fields``), e.g. ("image", "caption"); default ("image", "label").
    pad: pad each batch to its largest image (images of their own size, e.g.
        Resize(800, max_size=1333) without a crop) and also yield the true (height, width)
        of each, an int64 (B, 2) tensor after the fields; pad_multiple: round each padded
        side up to a multiple of it (32 for most detection backbones); mask_pad_value: the
        "mask" field's padding (255, the usual ignore index). Boxes ("boxes", a list of
        (n, 4) tensors), their per-box fields and "mask" follow every crop, resize and flip.
    log_every: write ``str(loader.stats())`` through logging every N batches (an int) or
        every so many seconds ("30s" or a timedelta, from the first batch); None: never.
    options: a LoaderOptions holding all of the above instead (not both).
"""


@dataclass(frozen=True)
class LoaderOptions:
    """Every Loader option with its default (docs/loader.md describes each)."""

    batch_size: int = 256
    shuffle: object = "global"        # "global"/True, "block", None/False
    seed: int = 0
    num_workers: int = 2
    drop_last: bool = False           # like torch's DataLoader
    transforms: tuple = ()            # Resize, RandomResizedCrop, ..., Normalize
    sample_transform: object = None   # fn(HWC uint8 ndarray) -> HWC uint8 ndarray
    dtype: object = None              # None: uint8, or float32 with Normalize
    device: object = "cpu"
    indices: object = None            # read only these samples (a subset / split)
    rank: int | None = None           # None: torch.distributed's, or torchrun's env
    world_size: int | None = None
    prefetch: int | None = None       # batches in flight (default 2 x workers, >= 2)
    worker_kind: str = "thread"       # "thread" or "process"
    timeout: float | None = None      # seconds to wait for one batch before failing
    on_error: str = "raise"           # or "skip": leave unreadable samples out
    return_index: bool = False        # also yield the batch's global sample indices
    device_transforms: bool | None = None  # None: on the GPU for CUDA, else on the host
    reduced_decode: bool = True       # decode JPEGs at a reduced DCT scale where it can
    block_size: int = order_mod.DEFAULT_BLOCK_SIZE   # geometry of shuffle="block"
    block_window: int = order_mod.DEFAULT_WINDOW
    log_every: object = None          # the stats line through logging: N batches or "30s"
    pin_memory: bool = False          # DataLoader's: CPU batches in page-locked memory
    prefetch_factor: int | None = None  # DataLoader's: batches in flight per worker
    persistent_workers: bool = True   # False: stop the workers after each epoch
    fields: tuple = ("image", "label")  # what each batch holds, in order (fieldbatch.py)
    pad: bool = False                 # pad each batch to its largest image (padding.py)
    pad_multiple: int = 1             # ... with each side rounded up to a multiple of this
    mask_pad_value: int = 255         # the "mask" field's padding (an ignore index)

    def __post_init__(self):
        check_auto(self)
        if int(self.batch_size) < 1 or self.workers < 0 or int(self.seed) < 0:
            raise ValueError(f"batch_size {self.batch_size} must be >= 1, num_workers "
                             f"{self.num_workers} >= 0, seed {self.seed} >= 0")
        if self.worker_kind not in WORKER_KINDS:
            raise ValueError(f"worker_kind {self.worker_kind!r}: expected one of {WORKER_KINDS}")
        if self.prefetch not in (None, AUTO) and not 1 <= int(self.prefetch) <= MAX_PREFETCH:
            raise ValueError(f"prefetch {self.prefetch}: expected 1 to {MAX_PREFETCH} batches")
        if self.workers > MAX_WORKERS:  # each is a thread or process, each has buffers
            raise ValueError(f"num_workers {self.num_workers}: expected at most {MAX_WORKERS}")
        if self.timeout == 0:  # DataLoader's "wait forever"
            object.__setattr__(self, "timeout", None)
        check_prefetch(self.prefetch, self.prefetch_factor)
        if self.in_flight > MAX_PREFETCH:  # per worker x workers: the same limit as prefetch
            raise ValueError(f"prefetch_factor {self.prefetch_factor} x {self.num_workers} "
                             f"workers = {self.in_flight} batches in flight: expected at most "
                             f"{MAX_PREFETCH}")
        if self.timeout is not None and not float(self.timeout) > 0:
            raise ValueError(f"timeout {self.timeout}: expected seconds > 0, or None (or 0)")
        if self.sample_transform is not None and not callable(self.sample_transform):
            raise TypeError(f"sample_transform {self.sample_transform!r} is not callable")
        if not isinstance(self.transforms, (list, tuple)):
            raise TypeError(f"transforms must be a list of transforms, got {self.transforms!r}")
        object.__setattr__(self, "transforms", tuple(self.transforms))
        object.__setattr__(self, "shuffle", order_mod.check_shuffle(self.shuffle))
        check_on_error(self.on_error)
        parse_log_every(self.log_every)
        check_pad(self.pad, self.pad_multiple, self.mask_pad_value)

    @property
    def pad_stride(self) -> int:
        """0 without ``pad``, else the multiple each padded side is rounded up to."""
        return check_pad(self.pad, self.pad_multiple, self.mask_pad_value)

    @property
    def workers(self) -> int:
        """num_workers as a count ("auto": the most it may settle on, MAX_WORKERS)."""
        return MAX_WORKERS if self.num_workers == AUTO else int(self.num_workers)

    @property
    def in_flight(self) -> int:
        """Batches submitted ahead of the one being consumed ("auto": a bound until the
        Loader has settled the setting; autotune.py)."""
        workers = 1 if self.num_workers == AUTO else int(self.num_workers)
        if self.prefetch_factor is not None:
            return int(self.prefetch_factor) * max(1, workers)
        return max(2, 2 * workers) if self.prefetch in (None, AUTO) else int(self.prefetch)


def check_auto(o) -> None:
    """num_workers and prefetch: a count, or the string "auto" (nothing else)."""
    for name in ("num_workers", "prefetch"):
        value = getattr(o, name)
        if isinstance(value, str) and value != AUTO:
            raise ValueError(f"{name}={value!r}: expected a count or {AUTO!r}")


def resolve_device(device):
    """The torch.device batches are delivered on, fixed once: ``cuda`` without an index
    means ``LOCAL_RANK`` (torchrun) if set, else the current device. Raises when CUDA is
    asked for and not available."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} but CUDA is not available here (torch "
                           f"{torch.__version__}); use device='cpu'")
    if dev.index is None:
        local = os.environ.get("LOCAL_RANK")
        if local not in (None, "") and not local.strip().isdigit():
            raise ValueError(f"device={device!r}: LOCAL_RANK={local!r} is not a GPU index; "
                             f"torchrun sets it to 0, 1, ...; pass device='cuda:N' to choose")
        dev = torch.device("cuda", int(local) if local not in (None, "") else
                           torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise RuntimeError(f"device {dev} does not exist: {torch.cuda.device_count()} GPU(s) "
                           f"(LOCAL_RANK={os.environ.get('LOCAL_RANK')!r})")
    return dev


def use_device_transforms(choice, device) -> bool:
    """Where the transforms run: the GPU kernels for CUDA (Triton required unless the
    caller asks for host transforms), the host otherwise; ``True`` forces the kernels'
    path (on the CPU: their torch reference, or Triton's interpreter)."""
    if choice is not None:
        return bool(choice)
    if device.type != "cuda":
        return False
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError("device='cuda' finishes batches with Triton kernels, but triton is "
                           "not installed: pip install 'dlpack-io[gpu]' (or triton), or pass "
                           "device_transforms=False to transform on the CPU and copy the "
                           "finished batches")
    return True


def unwrap_subset(dataset, indices):
    """(our Dataset, positions or None): accepts torch's Subset (nested too) and ``indices``."""
    from torch.utils.data import Subset

    from dlpack_io.reader.dataset import Dataset

    positions = None
    while isinstance(dataset, Subset):
        inner = np.asarray(dataset.indices, dtype=np.int64).reshape(-1)
        positions = inner if positions is None else inner[positions]
        dataset = dataset.dataset
    if not isinstance(dataset, Dataset):
        raise TypeError(f"Loader reads a dlpack_io.reader.Dataset (or a torch Subset of one), "
                        f"not {type(dataset).__name__}")
    if indices is not None:
        chosen = np.asarray(indices, dtype=np.int64).reshape(-1)
        positions = chosen if positions is None else positions[chosen]
    if positions is not None:
        n = len(dataset)
        if positions.size and (positions.min() < 0 or positions.max() >= n):
            bad = int(positions[(positions < 0) | (positions >= n)][0])
            raise IndexError(f"indices: sample {bad} is out of range for {n} samples")
        if len(np.unique(positions)) != len(positions):
            raise ValueError("indices: a sample is listed twice; each sample is read once "
                             "per epoch")
    return dataset, positions
