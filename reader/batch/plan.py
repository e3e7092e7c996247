"""What a batch is: sample indices -> their records and every per-sample parameter.

The first of the batch path's three steps (then :mod:`hostbuild`: pixels on the host,
:mod:`devicefinish`: the finish on the GPU). Two functions:

* :func:`compile_spec` (once, when the Loader is built): check the user's ``transforms``
  list and resolve it into a :class:`TransformSpec`;
* :func:`plan_batch` (per batch, vectorized): look the samples up and draw their crop
  boxes, flips and colour-jitter factors, a pure function of (seed, epoch, sample index),
  so a sample gets the same parameters whichever worker, rank or resume point handles it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dlpack_io.kernels.records import NEUTRAL_FACTORS
from dlpack_io.reader.batch import rng
from dlpack_io.reader.batch.errors import SampleError
from dlpack_io.reader.batch.skips import skipped_from
from dlpack_io.reader.batch.transforms import (
                                               CROPS, PUBLIC, CenterCrop, ColorJitter, CutMix, MixUp, Normalize, RandomCrop,
                                               RandomErasing, RandomHorizontalFlip, RandomResizedCrop, RandomVerticalFlip,
                                               Resize, ResizeThenCrop, TransformError)
from dlpack_io.reader.batch.autoaugment import AUGMENTS
from dlpack_io.reader.batch.geometry import decode_windows
from dlpack_io.reader.batch.padding import pad_params, sample_sizes

ORDER_HELP = ("transforms must come in this order: [Resize] [RandomResizedCrop | RandomCrop | "
              "CenterCrop], then RandomHorizontalFlip / RandomVerticalFlip / ColorJitter in any "
              "order (each at most once), then Normalize last (only RandomErasing, then MixUp / "
              "CutMix, may follow it); Resize cannot precede "
              "RandomResizedCrop, and Resize(int) needs a crop after it")


@dataclass(frozen=True)
class TransformSpec:
    """The resolved transforms: one geometry, flip probabilities, jitter, normalisation."""

    geometry: object = None          # a crop, ResizeThenCrop, or None (images of one size)
    flip_h: float = 0.0
    flip_v: float = 0.0
    jitter: ColorJitter | None = None
    normalize: Normalize | None = None
    dtype: object = None             # torch dtype of the output images
    reduced_decode: bool = True      # decode JPEGs at a reduced DCT scale when a resize allows
    erasing: RandomErasing | None = None  # on the finished batch (erasing.py)
    augment: object = None           # AutoAugment / RandAugment / TrivialAugmentWide (host)
    mixes: tuple = ()                # MixUp / CutMix on the delivered batch (mixing.py)
    pad: int = 0                     # Loader(pad=True): the pad multiple, 0 off (padding.py)

    @property
    def resample(self) -> tuple[str, bool]:
        """(interpolation, antialias) of the geometry's resize (torchvision's meanings)."""
        return (getattr(self.geometry, "interpolation", "bilinear"),
                bool(getattr(self.geometry, "antialias", True)))

    @property
    def has_epilogue(self) -> bool:
        """True when pixels need the epilogue (jitter, or a float output)."""
        import torch

        return self.jitter is not None or self.dtype != torch.uint8

    def draw(self, seed: int, epoch: int, indices, heights, widths) -> "SampleParams":
        """Boxes, flips and jitter of the samples ``indices`` (a pure function)."""
        indices = np.asarray(indices, dtype=np.int64)
        exact = windows = None
        if self.geometry is None:
            boxes, size = full_image_boxes(heights, widths, indices, one_size=not self.pad)
            resize = False
        else:
            boxes = self.geometry.boxes(heights, widths, seed, epoch, indices)
            size, resize = self.geometry.size, self.geometry.resizes
        size = (size, size) if isinstance(size, int) else tuple(size)  # int: pad sets it
        sizes = sample_sizes(self.geometry, heights, widths) if self.pad else None
        if isinstance(self.geometry, ResizeThenCrop):
            exact = self.geometry.exact_boxes(heights, widths, seed, epoch, indices)
            windows = decode_windows(exact, size if sizes is None else sizes.T,
                                     np.asarray(heights, np.int64), np.asarray(widths, np.int64))
        fh = rng.uniforms(seed, epoch, rng.STREAM_FLIP_H, indices)[:, 0] < self.flip_h
        fv = rng.uniforms(seed, epoch, rng.STREAM_FLIP_V, indices)[:, 0] < self.flip_v
        factors, order = draw_jitter(self.jitter, seed, epoch, indices)
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
    sizes: np.ndarray | None = None    # (N, 2) true sizes in a padded batch (padding.py)

    def take(self, rows) -> "SampleParams":
        """The parameters of the given rows (an index array or boolean mask)."""
        pick = (lambda a: None if a is None else a[rows])
        return replace(self, boxes=self.boxes[rows], flip_h=self.flip_h[rows],
                       flip_v=self.flip_v[rows], jitter=pick(self.jitter), order=pick(self.order),
                       exact=pick(self.exact), windows=pick(self.windows),
                       sizes=pick(self.sizes))


def draw_jitter(jitter: ColorJitter | None, seed: int, epoch: int, indices):
    """(factors (N, 4) float32, order (N, 4) int8) of torchvision's ColorJitter.get_params:
    each enabled factor uniform in its range, disabled ones neutral; a uniformly random
    order of the four ops (disabled ops are identities wherever they fall)."""
    if jitter is None:
        return None, None
    u = rng.uniforms(seed, epoch, rng.STREAM_JITTER, indices, 8)
    factors = np.empty((len(u), 4), dtype=np.float32)
    for j, (rng_range, neutral) in enumerate(zip(jitter.ranges, NEUTRAL_FACTORS)):
        if rng_range is None:
            factors[:, j] = neutral
        else:
            factors[:, j] = rng_range[0] + u[:, j] * (rng_range[1] - rng_range[0])
    order = np.argsort(u[:, 4:8], axis=1, kind="stable").astype(np.int8)
    return factors, order


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


# ---- compile the user's list ------------------------------------------------------------
_STAGE = {Resize: 0, RandomResizedCrop: 1, RandomCrop: 1, CenterCrop: 1,
          RandomHorizontalFlip: 2, RandomVerticalFlip: 2, ColorJitter: 2, Normalize: 3,
          RandomErasing: 4, MixUp: 5, CutMix: 5, **{cls: 2 for cls in AUGMENTS}}


def _check_augment(transforms, names) -> None:
    """An AutoAugment-like op sees the cropped, flipped image and comes before ColorJitter
    (the order in which the Loader applies them); at most one of them."""
    at = [k for k, t in enumerate(transforms) if isinstance(t, AUGMENTS)]
    if not at:
        return
    flips = [k for k, t in enumerate(transforms)
             if isinstance(t, (RandomHorizontalFlip, RandomVerticalFlip))]
    jitter = [k for k, t in enumerate(transforms) if isinstance(t, ColorJitter)]
    if len(at) > 1 or any(k > at[0] for k in flips) or any(k < at[0] for k in jitter):
        raise ValueError(f"{ORDER_HELP}; one of AutoAugment / RandAugment / "
                         f"TrivialAugmentWide goes after the flips and before ColorJitter; "
                         f"got [{', '.join(names)}]")


def _check_order(transforms) -> None:
    names = [type(t).__name__ for t in transforms]
    for t in transforms:
        if not isinstance(t, PUBLIC):
            raise TypeError(f"{t!r} is not a dlpack_io.reader transform ({', '.join(c.__name__ for c in PUBLIC)}); "
                            f"run your own per-sample function with sample_transform=fn")
    stages = [_STAGE[type(t)] for t in transforms]
    kinds = [type(t) for t in transforms]
    crops = [k for k in kinds if k in CROPS]
    if stages != sorted(stages) or len(set(kinds)) != len(kinds) or len(crops) > 1:
        raise ValueError(f"{ORDER_HELP}; got [{', '.join(names)}]")
    _check_augment(transforms, names)
    if Resize in kinds and RandomResizedCrop in kinds:
        raise ValueError(f"{ORDER_HELP}; got [{', '.join(names)}] (RandomResizedCrop picks its "
                         f"box relative to the image: drop the Resize)")


def _geometry(transforms, pad: int = 0):
    resize = next((t for t in transforms if isinstance(t, Resize)), None)
    crop = next((t for t in transforms if isinstance(t, CROPS)), None)
    if resize is None:
        return crop
    if crop is None and not isinstance(resize.size, tuple) and not pad:
        raise ValueError(f"Resize({resize.size}) alone gives every image its own size, which "
                         f"cannot be batched: follow it by CenterCrop/RandomCrop, or give "
                         f"Resize((height, width)) (or Loader(pad=True)); {ORDER_HELP}")
    return ResizeThenCrop(resize, crop)


def compile_spec(transforms=(), *, dtype=None, reduced_decode: bool = True,
                 pad: int = 0) -> TransformSpec:
    """Check ``transforms`` (torchvision-named objects of this package) and resolve them.

    ``dtype`` None means uint8 without Normalize, float32 with it. Raises ValueError /
    TypeError naming what is wrong and which orders work."""
    import torch

    transforms = list(transforms or ())
    _check_order(transforms)
    norm = next((t for t in transforms if isinstance(t, Normalize)), None)
    if dtype is None:
        dtype = torch.float32 if norm is not None else torch.uint8
    if dtype not in (torch.uint8, torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {dtype}: expected torch.uint8, float16, bfloat16 or float32")
    if norm is not None and dtype == torch.uint8:
        raise ValueError("Normalize needs a float dtype (e.g. dtype=torch.float16); "
                         "dtype=torch.uint8 gives raw pixels")
    if norm is not None and len(norm.mean) != 3:
        raise ValueError(f"Normalize: {len(norm.mean)} means/stds for 3-channel RGB images")
    pick = (lambda cls: next((t for t in transforms if isinstance(t, cls)), None))
    flip_h, flip_v = pick(RandomHorizontalFlip), pick(RandomVerticalFlip)
    geometry = _geometry(transforms, pad)
    mode, antialias = (getattr(geometry, "interpolation", "bilinear"),
                       getattr(geometry, "antialias", True))
    # the DCT downscale is itself a low-pass: only an antialiased filter may start from it
    reduce = bool(reduced_decode) and antialias and mode != "nearest"
    mixes = tuple(t for t in transforms if isinstance(t, (MixUp, CutMix)))
    return TransformSpec(geometry, flip_h.p if flip_h else 0.0,
                         flip_v.p if flip_v else 0.0, pick(ColorJitter), norm, dtype, reduce,
                         erasing=pick(RandomErasing), mixes=mixes, augment=pick(AUGMENTS),
                         pad=int(pad))


# ---- plan one batch ---------------------------------------------------------------------
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
