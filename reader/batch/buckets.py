"""Batches of every shape: aspect-ratio buckets and token budgets (``Loader(buckets=...)``).

    Loader(ds, batch_size=16, buckets=AspectBuckets(area=1024 * 1024, multiple=64),
           transforms=[RandomHorizontalFlip(), Normalize()])          # SDXL-style buckets
    Loader(ds, batch_size=256, buckets=TokenBudget(tokens=8192, patch=16, max_side=512),
           transforms=[RandomHorizontalFlip(), Normalize()])          # NaFlex-style packing

A bucketing is two things, both here:

* **a geometry** for the plan stage, in place of a crop: :class:`AspectBuckets` resizes each
  sample to cover its bucket (the (height, width) nearest its own aspect ratio, in log-ratio)
  and crops the bucket out of it, random or centred, keeping its aspect; :class:`TokenBudget`
  resizes each sample whole, keeping its aspect, to sides that are multiples of ``patch``
  (at most ``max_side``, at least one patch), and the batch is padded to its largest
  sample with the true sizes beside it (``Output(pad=True)``'s shape). Boxes and masks
  follow both through the same fractional boxes as the pixels (reader/transforms/geometry.py).
* **a split** for the order stage, in place of ``order.rank_part``: the epoch's sequence of
  samples (order.py's shuffle) is cut into batches that each hold one bucket (AspectBuckets:
  a batch closes when it has ``batch_size`` samples of its bucket; the batches come in the
  order they close, each bucket's short last one at the end) or fill a token budget
  (TokenBudget: in sequence order, a batch closes when the next sample would pass
  ``tokens``, or at ``batch_size`` samples). Then every rank gets the same number of batches
  (a DDP step must not hang): with ``drop_last`` the last few batches are left out; without
  it the largest batches are halved until the count divides by the world size, so every
  sample is read exactly once. Rank ``r`` takes a contiguous run of the batches.

Both are pure functions of (the sequence, the samples' stored sizes, batch size, drop_last,
rank, world size), so the bucketed order is as exact as the fixed one: the same batches for
any worker kind, epochs that differ, and resume (resume.py) on any world size, since a split
of what is left of an epoch is again such a function.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dlpack_io.reader.transforms.geometry import TransformError, check_interpolation, round_boxes

MAX_BUCKETS = 4096      # beyond this: a typo, not a bucket list
OPEN = 8                # a token budget's batches open at once (more: fuller, less in order)
NEW_SHAPE = 0.25        # padding (of its own area) past which a sample opens a new batch
FEW = 8                 # shapes sort a budget only when it holds this many of its largest
#                         samples (with fewer, alike shapes would leave batches part empty)
MAX_SIDE = 1 << 15      # pixels of a bucket or a resized side


def _positive(name: str, value, limit: int = MAX_SIDE * MAX_SIDE) -> int:
    if isinstance(value, bool) or int(value) != value or not 1 <= int(value) <= limit:
        raise ValueError(f"{name}={value!r}: expected a whole number from 1 to {limit}")
    return int(value)


def _bucket_list(area: int, multiple: int, max_ratio: float) -> tuple:
    """Every (h, w), both multiples of ``multiple``, with h * w within 10% of ``area`` and
    an aspect ratio up to ``max_ratio`` either way: for each width, the height nearest the
    area (ties: the smaller), kept when it qualifies; sorted from tallest to widest."""
    out = set()
    for w in range(multiple, int(math.sqrt(area * max_ratio)) + multiple + 1, multiple):
        h = max(multiple, int(round(area / w / multiple)) * multiple)
        if abs(h * w - area) <= 0.1 * area and max(h / w, w / h) <= max_ratio:
            out.add((h, w))
    return tuple(sorted(out, key=lambda s: (-s[0] / s[1], s)))


@dataclass(frozen=True)
class AspectBuckets:
    """SDXL-style aspect buckets: each sample resized to cover the (height, width) bucket
    nearest its aspect ratio and cropped to it (``crop``: "random" or "center"); every batch
    holds one bucket. ``sizes`` lists the buckets: made from ``area``, ``multiple`` and
    ``max_ratio`` (both sides multiples of ``multiple``, area within 10% of ``area``, aspect
    up to ``max_ratio``), or given explicitly as (height, width) pairs."""

    area: int = 1024 * 1024
    multiple: int = 64
    max_ratio: float = 4.0
    sizes: tuple = None
    crop: str = "random"
    interpolation: object = "bilinear"
    antialias: object = True
    resizes = True
    stream = 1   # the crop's random stream (as RandomResizedCrop's: one geometry per recipe)

    def __post_init__(self):
        area, multiple = _positive("area", self.area), _positive("multiple", self.multiple,
                                                                 MAX_SIDE)
        ratio = float(self.max_ratio)
        if not 1.0 <= ratio <= 64.0:
            raise ValueError(f"max_ratio={self.max_ratio!r}: expected 1 to 64")
        if self.crop not in ("random", "center"):
            raise ValueError(f"AspectBuckets(crop={self.crop!r}): expected 'random' or 'center'")
        mode, aa = check_interpolation("AspectBuckets", self.interpolation, self.antialias)
        sizes = _bucket_list(area, multiple, ratio) if self.sizes is None else tuple(
            (_positive("bucket height", h, MAX_SIDE), _positive("bucket width", w, MAX_SIDE))
            for h, w in self.sizes)
        if not sizes or len(sizes) > MAX_BUCKETS:
            raise ValueError(f"AspectBuckets: {len(sizes)} buckets for area={area}, multiple="
                             f"{multiple}, max_ratio={ratio}; expected 1 to {MAX_BUCKETS} "
                             f"(a larger area or a smaller multiple makes some)")
        for name, value in (("area", area), ("multiple", multiple), ("max_ratio", ratio),
                            ("sizes", sizes), ("interpolation", mode), ("antialias", aa)):
            object.__setattr__(self, name, value)

    def bucket_of(self, heights, widths) -> np.ndarray:
        """(N,) int64: each sample's bucket, the one nearest its aspect ratio in log-ratio
        (ties: the first listed)."""
        aspect = np.log(np.asarray(heights, np.float64) / np.asarray(widths, np.float64))
        target = np.log(np.array([h / w for h, w in self.sizes]))
        return np.argmin(np.abs(aspect[:, None] - target[None, :]), axis=1).astype(np.int64)

    def size_for(self, heights, widths, indices) -> tuple[int, int]:
        """The bucket of a batch (all its samples share one: the split made it so)."""
        b = self.bucket_of(heights, widths)
        if len(b) and np.any(b != b[0]):
            i = int(np.flatnonzero(b != b[0])[0])
            raise TransformError(f"AspectBuckets: one batch holds buckets {self.sizes[b[0]]} "
                                 f"and {self.sizes[b[i]]}: batches of buckets come from "
                                 f"Loader(buckets=...), not from transforms", int(indices[i]))
        return self.sizes[int(b[0])] if len(b) else self.sizes[0]

    def crops(self, heights, widths, draws, indices):
        """(resized (N, 2) int64, crop top-left (N, 2) int64 in the resized image, bucket
        (h, w)): each sample resized to cover the bucket, the bucket cut out of it."""
        hs, ws = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
        bh, bw = self.size_for(hs, ws, indices)
        scale = np.maximum(bh / hs, bw / ws)
        rh = np.maximum(bh, np.rint(hs * scale).astype(np.int64))
        rw = np.maximum(bw, np.rint(ws * scale).astype(np.int64))
        if self.crop == "center":
            top, left = (rh - bh) // 2, (rw - bw) // 2
        else:
            u = draws(self.stream, indices, 2)
            top = np.floor(u[:, 0] * (rh - bh + 1)).astype(np.int64)
            left = np.floor(u[:, 1] * (rw - bw + 1)).astype(np.int64)
        return np.stack([rh, rw], axis=1), np.stack([top, left], axis=1), (bh, bw)

    def exact_boxes(self, heights, widths, draws, indices) -> np.ndarray:
        """(N, 4) float64 boxes (top, left, height, width) in the stored image: the bucket's
        crop of the resized image mapped back, exactly (as Resize then crop)."""
        hs, ws = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
        resized, corner, (bh, bw) = self.crops(hs, ws, draws, indices)
        sy, sx = hs / resized[:, 0], ws / resized[:, 1]
        return np.stack([corner[:, 0] * sy, corner[:, 1] * sx, bh * sy, bw * sx], axis=1)

    def boxes(self, heights, widths, draws, indices) -> np.ndarray:
        """The exact boxes rounded to whole stored pixels (what the GPU kernel resamples)."""
        hs, ws = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
        return round_boxes(self.exact_boxes(hs, ws, draws, indices), hs, ws)

    def largest(self) -> int:
        """Pixels of the largest bucket (what a batch slot must hold per sample)."""
        return max(h * w for h, w in self.sizes)

    def batches(self, heights, widths, batch_size: int, drop_last: bool) -> list:
        """Positions (into the sequence whose sizes these are) of each batch, in the order
        they close: every ``batch_size`` samples of one bucket, then each bucket's short last
        batch (left out with ``drop_last``)."""
        bucket = self.bucket_of(heights, widths)
        closing, out = [], []
        for b in np.unique(bucket):
            at = np.flatnonzero(bucket == b)
            full = len(at) // batch_size
            for j in range(full):
                chunk = at[j * batch_size:(j + 1) * batch_size]
                closing.append((int(chunk[-1]), len(out)))
                out.append(chunk)
            if len(at) % batch_size and not drop_last:
                closing.append((len(bucket) + int(b), len(out)))  # at the end, by bucket
                out.append(at[full * batch_size:])
        return [out[k] for _, k in sorted(closing)]


@dataclass(frozen=True)
class TokenBudget:
    """NaFlex-style batches: each sample resized whole, keeping its aspect ratio, to sides
    that are multiples of ``patch`` (at most ``max_side``, at least one patch; images are not
    enlarged), and batches filled up to ``tokens`` tokens ((h / patch) * (w / patch) each),
    delivered padded to their largest sample with the true (height, width) of each."""

    tokens: int = 4096
    patch: int = 16
    max_side: int = 512
    interpolation: object = "bilinear"
    antialias: object = True
    resizes = True
    stream = None  # nothing random: the whole image

    def __post_init__(self):
        patch = _positive("patch", self.patch, MAX_SIDE)
        side = _positive("max_side", self.max_side, MAX_SIDE)
        tokens = _positive("tokens", self.tokens, 1 << 30)
        if side < patch:
            raise ValueError(f"TokenBudget: max_side={side} is below one patch ({patch})")
        most = (side // patch) ** 2
        if tokens < most:
            raise ValueError(f"TokenBudget(tokens={tokens}) cannot hold one image of "
                             f"max_side={side} ({most} tokens of patch {patch}): raise tokens "
                             f"or lower max_side")
        mode, aa = check_interpolation("TokenBudget", self.interpolation, self.antialias)
        for name, value in (("patch", patch), ("max_side", side), ("tokens", tokens),
                            ("interpolation", mode), ("antialias", aa)):
            object.__setattr__(self, name, value)

    def sizes_of(self, heights, widths) -> np.ndarray:
        """(N, 2) int64 resized (height, width) of each sample."""
        hs = np.asarray(heights, np.float64)
        ws = np.asarray(widths, np.float64)
        scale = np.minimum(1.0, self.max_side / np.maximum(hs, ws))
        top = self.max_side // self.patch * self.patch

        def side(v):  # the nearest multiple of the patch (halves up)
            return np.clip(np.floor(v * scale / self.patch + 0.5) * self.patch, self.patch,
                           top).astype(np.int64)
        return np.stack([side(hs), side(ws)], axis=1)

    def tokens_of(self, heights, widths) -> np.ndarray:
        """(N,) int64 tokens of each sample."""
        s = self.sizes_of(heights, widths)
        return (s[:, 0] // self.patch) * (s[:, 1] // self.patch)

    def size_for(self, heights, widths, indices) -> tuple[int, int]:
        """The padded size of a batch: its largest sample's sides."""
        s = self.sizes_of(heights, widths)
        return tuple(int(v) for v in s.max(axis=0)) if len(s) else (self.patch, self.patch)

    def exact_boxes(self, heights, widths, draws, indices) -> np.ndarray:
        """(N, 4) float64: every sample's whole stored image."""
        hs, ws = np.asarray(heights, np.float64), np.asarray(widths, np.float64)
        return np.stack([np.zeros_like(hs), np.zeros_like(ws), hs, ws], axis=1)

    def boxes(self, heights, widths, draws, indices) -> np.ndarray:
        """(N, 4) int64: the whole stored images."""
        hs, ws = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
        return np.stack([np.zeros_like(hs), np.zeros_like(ws), hs, ws], axis=1)

    def largest(self) -> int:
        """Pixels of the largest padded sample."""
        top = self.max_side // self.patch * self.patch
        return top * top

    def batches(self, heights, widths, batch_size: int, drop_last: bool) -> list:
        """Positions of each batch. The samples in sequence order, each into the open batch
        (at most OPEN) where it adds the least padding and still fits the budget (ties: the
        least room left); one that would pad more than NEW_SHAPE of its own area opens a
        batch of its own while fewer than OPEN are open, else the oldest open one closes.
        A batch closes once no sample can fit it any more, or at ``batch_size`` samples; the
        batches come in the order they close. Mixed shapes thus sort themselves into
        batches of alike shapes (0.2% padding instead of 27% on photos of five aspect
        ratios), each about full; a budget of fewer than FEW of the largest samples packs by
        tokens alone (the fill matters more there). With ``drop_last`` a last batch under
        85% of the budget is left out."""
        sizes = self.sizes_of(heights, widths)
        tokens = ((sizes[:, 0] // self.patch) * (sizes[:, 1] // self.patch)).tolist()
        smallest = min(tokens, default=1)
        fine = FEW * max(tokens, default=1) <= self.tokens  # many samples a batch: shapes count
        opened, done = [], []  # open: [room, height, width, count, positions], oldest first
        for pos, (t, (h, w)) in enumerate(zip(tokens, sizes.tolist())):
            best, cost = None, None
            for b in opened:
                if b[0] >= t:  # the padding this sample adds to b, then the tighter fit
                    box = max(b[1], h) * max(b[2], w)
                    pad = (b[3] + 1) * box - b[3] * b[1] * b[2] - h * w if fine else 0
                    key = (pad, b[0])
                    if cost is None or key < cost:
                        best, cost = b, key
            if best is None or (cost[0] > NEW_SHAPE * h * w and len(opened) < OPEN):
                if len(opened) == OPEN:
                    done.append(opened.pop(0)[4])
                best = [self.tokens, 0, 0, 0, []]
                opened.append(best)
            best[0] -= t
            best[1], best[2], best[3] = max(best[1], h), max(best[2], w), best[3] + 1
            best[4].append(pos)
            if best[0] < smallest or best[3] == batch_size:
                opened.remove(best)
                done.append(best[4])
        done += self._tail(sorted(p for b in opened for p in b[4]), tokens, batch_size)
        if drop_last and done and self.tokens - sum(tokens[p] for p in done[-1]) > \
                0.15 * self.tokens:
            done.pop()
        return [np.asarray(b, dtype=np.int64) for b in done]


    def _tail(self, rest: list, tokens: list, batch_size: int) -> list:
        """The samples still open when the sequence ends, packed again in sequence order
        into as few batches as they fill (rather than up to OPEN half-empty ones)."""
        out, room = [], 0
        for p in rest:
            if not out or tokens[p] > room or len(out[-1]) == batch_size:
                out.append([])
                room = self.tokens
            out[-1].append(p)
            room -= tokens[p]
        return out


BUCKETINGS = (AspectBuckets, TokenBudget)


def check_buckets(buckets):
    """``Loader(buckets=...)``: None, an AspectBuckets or a TokenBudget."""
    if buckets is not None and not isinstance(buckets, BUCKETINGS):
        raise TypeError(f"buckets={buckets!r}: expected AspectBuckets(...) or TokenBudget(...) "
                        f"(from dlpack_io.reader import AspectBuckets, TokenBudget)")
    return buckets


def equal_counts(batches: list, world_size: int, drop_last: bool) -> list:
    """The batches made a multiple of ``world_size``: the last ones left out with
    ``drop_last``, else the largest halved (the later of equals first; a batch of one
    leaves an empty half) until they divide."""
    if drop_last:
        return batches[:len(batches) // world_size * world_size]
    batches = list(batches)
    while len(batches) % world_size:
        k = max(range(len(batches)), key=lambda i: (len(batches[i]), i))
        b = batches[k]
        half = len(b) - len(b) // 2
        batches[k:k + 1] = [b[:half], b[half:]]
    return batches


def plan_ranks(bucketing, sequence: np.ndarray, sizes, world_size: int, batch_size: int,
               drop_last: bool) -> list:
    """[(positions in ``sequence``, batch boundaries within them)] of every rank: the
    bucketed counterpart of ``order.rank_part`` (resume.py marks what each rank consumed
    from it); ``sizes(sequence) -> (heights, widths)`` reads the stored sizes."""
    hs, ws = sizes(sequence)
    batches = equal_counts(bucketing.batches(hs, ws, batch_size, drop_last), world_size,
                           drop_last)
    per, out = len(batches) // world_size, []
    for rank in range(world_size):
        mine = batches[rank * per:(rank + 1) * per]
        counts = np.array([len(b) for b in mine], dtype=np.int64)
        positions = np.concatenate(mine).astype(np.int64) if mine else np.zeros(0, np.int64)
        out.append((positions, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)))
    return out
