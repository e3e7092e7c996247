"""The plan stage: sample indices -> their records and every per-sample parameter.

The second of the batch path's four stages (order -> **plan** -> build -> finish). Two
entry points:

* :func:`compile_spec` (once, when the Loader is built): check the user's ``transforms``
  list and resolve it into a :class:`TransformSpec`;
* :func:`plan_batch` (per batch, vectorized): look the samples up and draw their crop
  boxes, flips and colour-jitter factors.

Every random parameter of the Loader comes from here: :func:`uniforms` is a counter-based
generator, a pure function of (seed, epoch, stream, sample index, draw number), so a sample
gets the same parameters whichever worker, rank or resume point handles it, and no draw
depends on what was drawn before. The transforms (reader/transforms/) never draw for
themselves: they are handed ``draws`` (a :class:`Draws`), which knows the seed and epoch,
and ask it for their own stream.

Also here: the sizes of padded batches (``Loader(pad=True)``), which the plan fixes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from dlpack_io.reader.batch.errors import SampleError, skipped_from
from dlpack_io.reader.transforms.colour import epilogue_args, host_epilogue
from dlpack_io.reader.transforms.geometry import (RandomHorizontalFlip, RandomVerticalFlip,
                                                  ResizeThenCrop, TransformError,
                                                  decode_windows)

# ---- counter-based random numbers ------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK64 = (1 << 64) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser of a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _key(seed: int, epoch: int, stream: int) -> np.ndarray:
    """One uint64 key for (seed, epoch, stream); any Python ints (taken modulo 2**64)."""
    k = np.array([int(seed) & _MASK64], dtype=np.uint64)
    for part in (epoch, stream):
        k = _mix(k + _GOLDEN) ^ np.uint64(int(part) & _MASK64)
    return _mix(k + _GOLDEN)


def uniforms(seed: int, epoch: int, stream: int, indices, count: int = 1) -> np.ndarray:
    """Floats in [0, 1), shape (len(indices), count): draw j of sample indices[i] in
    ``stream`` (each op's own id: reader/transforms/). A pure function of its arguments
    (SplitMix64's finaliser applied in a chain); 53 random bits per float, the same on every
    machine and numpy version."""
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    draws = np.arange(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = _mix(idx * _GOLDEN + _key(seed, epoch, stream))
        x = _mix(x[:, None] + (draws[None, :] + np.uint64(1)) * _M2)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class Draws:
    """The uniforms of one (seed, epoch): ``draws(stream, indices, count)``, what every
    transform is handed to draw its parameters."""

    seed: int
    epoch: int

    def __call__(self, stream: int, indices, count: int = 1) -> np.ndarray:
        return uniforms(self.seed, self.epoch, stream, indices, count)


# ---- compile the user's list ----------------------------------------------------------
ORDER_HELP = ("transforms must come in this order: [Resize] [RandomResizedCrop | RandomCrop | "
              "CenterCrop], then RandomHorizontalFlip / RandomVerticalFlip / ColorJitter in any "
              "order (each at most once), then Normalize last (only RandomErasing, then MixUp / "
              "CutMix, may follow it); Resize cannot precede "
              "RandomResizedCrop, and Resize(int) needs a crop after it")
# Each op's ``role`` says where the compiled recipe keeps it: one geometry (a resize, a
# crop), flips, colour jitter, any per-sample host ops ("sample": they see the cropped and
# flipped uint8 image, in list order, in the workers), normalisation, then the ops on the
# finished batch (erasing, mixing).
ROLES = ("resize", "crop", "flip_h", "flip_v", "jitter", "sample", "normalize", "erasing",
         "mix")


@dataclass(frozen=True)
class TransformSpec:
    """The resolved transforms: one geometry, flip probabilities, jitter, normalisation."""

    geometry: object = None          # a crop, ResizeThenCrop, or None (images of one size)
    flip_h: float = 0.0
    flip_v: float = 0.0
    jitter: object = None            # ColorJitter or None
    normalize: object = None         # Normalize or None
    dtype: object = None             # torch dtype of the output images
    reduced_decode: bool = True      # decode JPEGs at a reduced DCT scale when a resize allows
    erasing: object = None           # RandomErasing, on the finished batch
    sample_ops: tuple = ()           # per-sample host ops (AutoAugment, ...), in list order
    mixes: tuple = ()                # MixUp / CutMix on the delivered batch
    pad: int = 0                     # Loader(pad=True): the pad multiple, 0 off
    has_epilogue: bool = False       # pixels need the epilogue (jitter, or a float output)
    epilogue: dict = field(default_factory=dict)  # the kernels' fixed epilogue arguments
    host_epilogue: object = None     # the same, validated for the host (colour.host_epilogue)

    @property
    def resample(self) -> tuple[str, bool]:
        """(interpolation, antialias) of the geometry's resize (torchvision's meanings)."""
        return (getattr(self.geometry, "interpolation", "bilinear"),
                bool(getattr(self.geometry, "antialias", True)))

    def draw(self, seed: int, epoch: int, indices, heights, widths) -> "SampleParams":
        """Boxes, flips and jitter of the samples ``indices`` (a pure function)."""
        indices = np.asarray(indices, dtype=np.int64)
        draws, exact, windows = Draws(seed, epoch), None, None
        if self.geometry is None:
            boxes, size = full_image_boxes(heights, widths, indices, one_size=not self.pad)
            resize = False
        else:
            boxes = self.geometry.boxes(heights, widths, draws, indices)
            size, resize = getattr(self.geometry, "size", None), self.geometry.resizes
            if hasattr(self.geometry, "size_for"):  # buckets: a size per batch
                size = self.geometry.size_for(heights, widths, indices)
        size = (size, size) if isinstance(size, int) else tuple(size)  # int: pad sets it
        sizes = sample_sizes(self.geometry, heights, widths) if self.pad else None
        if hasattr(self.geometry, "exact_boxes"):  # Resize then crop, or buckets
            exact = self.geometry.exact_boxes(heights, widths, draws, indices)
            windows = decode_windows(exact, size if sizes is None else sizes.T,
                                     np.asarray(heights, np.int64), np.asarray(widths, np.int64))
        fh = draws(RandomHorizontalFlip.stream, indices)[:, 0] < self.flip_h
        fv = draws(RandomVerticalFlip.stream, indices)[:, 0] < self.flip_v
        factors, order = (None, None) if self.jitter is None else \
            self.jitter.draw(draws, indices)
        params = SampleParams(boxes, fh, fv, factors, order, tuple(size), bool(resize),
                              exact, windows, self.resample)
        return params if sizes is None else pad_params(params, sizes, self.pad)


@dataclass(frozen=True)
class SampleParams:
    """Per-sample parameters of one batch (one row per sample)."""

    boxes: np.ndarray          # (N, 4) int64: top, left, height, width in the stored image
    flip_h: np.ndarray         # (N,) bool
    flip_v: np.ndarray         # (N,) bool
    jitter: np.ndarray | None  # (N, 4) float32: brightness, contrast, saturation, hue
    order: np.ndarray | None   # (N, 4) int8: the jitter ops in application order (0..3)
    out_size: tuple            # (height, width) of every output image
    resize: bool               # True: resample box -> out_size; False: box size == out_size
    exact: np.ndarray | None = None    # (N, 4) float64 fractional boxes (Resize + crop)
    windows: np.ndarray | None = None  # (N, 4) int64 decode windows around ``exact``
    resample: tuple = ("bilinear", True)  # (interpolation, antialias) of the resize
    sizes: np.ndarray | None = None    # (N, 2) true sizes in a padded batch

    def take(self, rows) -> "SampleParams":
        """The parameters of the given rows (an index array or boolean mask)."""
        pick = (lambda a: None if a is None else a[rows])
        return replace(self, boxes=self.boxes[rows], flip_h=self.flip_h[rows],
                       flip_v=self.flip_v[rows], jitter=pick(self.jitter), order=pick(self.order),
                       exact=pick(self.exact), windows=pick(self.windows),
                       sizes=pick(self.sizes))


def full_image_boxes(heights, widths, indices, one_size=True) -> tuple[np.ndarray, tuple]:
    """Boxes covering whole images (no geometry transform); all images must be one size
    (unless ``one_size`` is False: a padded batch)."""
    hs, ws = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
    if one_size and len(hs) and (np.any(hs != hs[0]) or np.any(ws != ws[0])):
        i = int(np.flatnonzero((hs != hs[0]) | (ws != ws[0]))[0])
        raise TransformError(f"without a crop or Resize every image must have one size, but "
                             f"this one is {int(hs[i])}x{int(ws[i])} and sample "
                             f"{int(indices[0])} is {int(hs[0])}x{int(ws[0])}: add e.g. "
                             f"RandomResizedCrop(224) or Resize((224, 224)) to transforms, or "
                             f"pack with --mode raw --size", int(indices[i]))
    zeros = np.zeros_like(hs)
    size = (int(hs[0]), int(ws[0])) if len(hs) else (0, 0)
    return np.stack([zeros, zeros, hs, ws], axis=1), size


def _role(t) -> str | None:
    """The op's role if it is one of ours (a class of dlpack_io.reader.transforms)."""
    cls = type(t)
    ours = cls.__module__.startswith("dlpack_io.reader.transforms.")
    return getattr(cls, "role", None) if ours else None


def _check_order(transforms) -> None:
    names = [type(t).__name__ for t in transforms]
    for t in transforms:
        if _role(t) not in ROLES:
            raise TypeError(f"{t!r} is not a dlpack_io.reader transform (Resize, "
                            f"RandomResizedCrop, RandomCrop, CenterCrop, RandomHorizontalFlip, "
                            f"RandomVerticalFlip, ColorJitter, Normalize, RandomErasing, MixUp, "
                            f"CutMix, AutoAugment, RandAugment, TrivialAugmentWide); run your "
                            f"own per-sample function with sample_transform=fn")
    stages = [t.stage for t in transforms]
    kinds = [type(t) for t in transforms]
    crops = [t for t in transforms if _role(t) == "crop"]
    if stages != sorted(stages) or len(set(kinds)) != len(kinds) or len(crops) > 1:
        raise ValueError(f"{ORDER_HELP}; got [{', '.join(names)}]")
    # a per-sample host op (AutoAugment, ...) sees the cropped, flipped image and comes
    # before ColorJitter (the order in which the Loader applies them)
    at = [k for k, t in enumerate(transforms) if _role(t) == "sample"]
    if at:
        flips = [k for k, t in enumerate(transforms) if _role(t) in ("flip_h", "flip_v")]
        jitter = [k for k, t in enumerate(transforms) if _role(t) == "jitter"]
        if any(k > at[0] for k in flips) or any(k < at[-1] for k in jitter):
            raise ValueError(f"{ORDER_HELP}; AutoAugment / RandAugment / TrivialAugmentWide "
                             f"(and any per-sample host op) goes after the flips and before "
                             f"ColorJitter; got [{', '.join(names)}]")
    _check_streams(transforms, names)
    if any(_role(t) == "resize" for t in transforms) and \
            any(type(t).__name__ == "RandomResizedCrop" for t in transforms):
        raise ValueError(f"{ORDER_HELP}; got [{', '.join(names)}] (RandomResizedCrop picks its "
                         f"box relative to the image: drop the Resize)")


def _check_streams(transforms, names) -> None:
    """Two ops may not draw from one random stream (their draws would be the same numbers);
    MixUp and CutMix share theirs on purpose: one draw per batch chooses between them."""
    seen = {}
    for t in transforms:
        stream = getattr(t, "stream", None)
        if stream is None or _role(t) == "mix":
            continue
        if stream in seen:
            raise ValueError(f"{type(seen[stream]).__name__} and {type(t).__name__} draw from "
                             f"one random stream ({stream}): use one of them; got "
                             f"[{', '.join(names)}]")
        seen[stream] = t


def _geometry(resize, crop, pad: int = 0):
    if resize is None:
        return crop
    if crop is None and not isinstance(resize.size, tuple) and not pad:
        raise ValueError(f"Resize({resize.size}) alone gives every image its own size, which "
                         f"cannot be batched: follow it by CenterCrop/RandomCrop, or give "
                         f"Resize((height, width)) (or Loader(pad=True)); {ORDER_HELP}")
    return ResizeThenCrop(resize, crop)


def compile_spec(transforms=(), *, dtype=None, reduced_decode: bool = True,
                 pad: int = 0, buckets=None) -> TransformSpec:
    """Check ``transforms`` (torchvision-named objects of this package) and resolve them.

    ``dtype`` None means uint8 without Normalize, float32 with it; ``buckets`` (an
    AspectBuckets or a TokenBudget: buckets.py) is the geometry instead of a resize or a
    crop. Raises ValueError / TypeError naming what is wrong and which orders work."""
    import torch

    transforms = list(transforms or ())
    _check_order(transforms)
    pick = (lambda role: next((t for t in transforms if _role(t) == role), None))
    norm = pick("normalize")
    if dtype is None:
        dtype = torch.float32 if norm is not None else torch.uint8
    if dtype not in (torch.uint8, torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {dtype}: expected torch.uint8, float16, bfloat16 or float32")
    if norm is not None and dtype == torch.uint8:
        raise ValueError("Normalize needs a float dtype (e.g. dtype=torch.float16); "
                         "dtype=torch.uint8 gives raw pixels")
    if norm is not None and len(norm.mean) != 3:
        raise ValueError(f"Normalize: {len(norm.mean)} means/stds for 3-channel RGB images")
    flip_h, flip_v, jitter = pick("flip_h"), pick("flip_v"), pick("jitter")
    if buckets is not None and (pick("resize") or pick("crop")):
        raise ValueError(f"buckets={type(buckets).__name__}(...) resizes and crops every "
                         f"sample to its batch's shape: leave "
                         f"{type(pick('resize') or pick('crop')).__name__} out of transforms")
    geometry = buckets if buckets is not None else _geometry(pick("resize"), pick("crop"), pad)
    mode, antialias = (getattr(geometry, "interpolation", "bilinear"),
                       getattr(geometry, "antialias", True))
    # the DCT downscale is itself a low-pass: only an antialiased filter may start from it
    reduce = bool(reduced_decode) and antialias and mode != "nearest"
    return TransformSpec(geometry, flip_h.p if flip_h else 0.0, flip_v.p if flip_v else 0.0,
                         jitter, norm, dtype, reduce, erasing=pick("erasing"),
                         sample_ops=tuple(t for t in transforms if _role(t) == "sample"),
                         pad=int(pad),
                         mixes=tuple(t for t in transforms if _role(t) == "mix"),
                         has_epilogue=jitter is not None or dtype != torch.uint8,
                         epilogue=epilogue_args(norm, dtype),
                         host_epilogue=host_epilogue(norm, jitter, dtype))


# ---- padded batches: Loader(pad=True) ----------------------------------------------------
# ``Resize(800, max_size=1333)`` without a crop gives every image its own size. With ``pad``
# each image is made at its own size, placed top-left in a batch as large as the batch's
# largest image (each side rounded up to ``pad_multiple``), and the rest is zero *after*
# normalisation, as torchvision's detection models batch images (GeneralizedRCNNTransform).
# The true (height, width) of every image is yielded beside the batch (finish stage).
MAX_PAD_MULTIPLE = 4096  # beyond this: a typo, not a stride


def check_pad(pad, pad_multiple, mask_pad_value) -> int:
    """The pad setting as one int: 0 (off), else the multiple each side is rounded up to
    (1: exactly the largest image). ValueError naming the bad value otherwise."""
    if not isinstance(pad, bool):
        raise TypeError(f"pad={pad!r}: expected True or False")
    multiple = int(pad_multiple)
    if not 1 <= multiple <= MAX_PAD_MULTIPLE:
        raise ValueError(f"pad_multiple={pad_multiple!r}: expected 1 to {MAX_PAD_MULTIPLE} "
                         f"(e.g. 32, the stride of a detection backbone)")
    if not isinstance(mask_pad_value, int) or not 0 <= mask_pad_value < 2**16:
        raise ValueError(f"mask_pad_value={mask_pad_value!r}: expected an int 0..65535 "
                         f"(255: the usual ignore index)")
    return multiple if pad else 0


def round_up(value, multiple: int):
    """``value`` rounded up to a multiple of ``multiple`` (ints or int arrays)."""
    return -(-value // multiple) * multiple


def sample_sizes(geometry, hs, ws) -> np.ndarray:
    """(N, 2) int64 output (height, width) of every sample under ``geometry`` (its own
    size for a Resize(int) without a crop; the stored size without geometry)."""
    hs, ws = np.asarray(hs, np.int64), np.asarray(ws, np.int64)
    if geometry is None:
        return np.stack([hs, ws], axis=1)
    if hasattr(geometry, "sizes_of"):  # a token budget: each sample at its own size
        return geometry.sizes_of(hs, ws)
    resize = getattr(geometry, "resize", None)
    if getattr(geometry, "crop", True) is None and not isinstance(resize.size, tuple):
        return np.stack(resize.resized_shape(hs, ws), axis=1)
    h, w = geometry.size
    return np.stack([np.full_like(hs, h), np.full_like(ws, w)], axis=1)


def pad_params(params, sizes: np.ndarray, multiple: int):
    """``params`` with per-sample ``sizes`` and the padded batch ``out_size``."""
    if not len(sizes):
        return replace(params, sizes=sizes)
    out = round_up(sizes.max(axis=0), multiple)
    return replace(params, sizes=sizes, out_size=(int(out[0]), int(out[1])))


def largest_output(geometry, dataset, multiple: int) -> tuple[int, int]:
    """(height, width) bounding every padded batch of ``dataset`` (sizes shared buffers)."""
    hs = np.concatenate([s.index["height"] for s in dataset.shards] or [np.ones(1)])
    ws = np.concatenate([s.index["width"] for s in dataset.shards] or [np.ones(1)])
    sizes = sample_sizes(geometry, hs, ws)
    out = round_up(sizes.max(axis=0, initial=1), max(1, multiple))
    return int(out[0]), int(out[1])


# ---- plan one batch -----------------------------------------------------------------------
@dataclass(frozen=True)
class BatchPlan:
    """A batch's lookups and random parameters, computed once, filled in ranges."""

    indices: np.ndarray    # (N,) global sample indices
    shard_ids: np.ndarray  # (N,) shard of each sample
    local: np.ndarray      # (N,) record within its shard
    entries: np.ndarray    # (N,) INDEX_DTYPE rows
    params: SampleParams
    skipped: tuple = ()    # Skipped entries of samples dropped while planning

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(N, 3, oh, ow) of the output batch."""
        return (len(self.indices), 3, *self.params.out_size)

    @property
    def labels(self) -> np.ndarray:
        """int64 labels of the batch."""
        return self.entries["label"].astype(np.int64)


def sample_error(dataset, index: int, exc: BaseException) -> SampleError:
    """A SampleError naming the shard file and record of sample ``index``."""
    try:
        where = dataset.where(int(index))
    except Exception:  # the location itself is broken: still name the sample
        where = f"sample {int(index)}"
    return SampleError(f"{where}: {type(exc).__name__}: {exc}", where, int(index))


def plan_batch(spec: TransformSpec, dataset, indices, *, seed: int, epoch: int,
               skip: bool = False) -> BatchPlan:
    """Look up and draw the parameters of the samples ``indices`` (vectorized).

    A sample whose transform cannot apply raises SampleError, or with ``skip`` is left out
    of the plan and listed in ``plan.skipped``."""
    indices = np.asarray(indices, dtype=np.int64)
    skipped = []
    while True:
        shard_ids, local, entries = dataset.lookup(indices)
        try:
            params = spec.draw(seed, epoch, indices, entries["height"], entries["width"])
            return BatchPlan(indices, shard_ids, local, entries, params, tuple(skipped))
        except TransformError as exc:
            error = sample_error(dataset, exc.sample, exc)
            if not skip or exc.sample not in indices:
                raise error from exc
            error.__cause__ = exc
            skipped.append(skipped_from(error))
            indices = indices[indices != exc.sample]
