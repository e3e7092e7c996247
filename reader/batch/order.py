"""Epoch order: which samples a rank reads, in which batches. Pure functions only.

Everything here is a function of (seed, epoch, data set size or shard sizes, rank,
world_size, batch size, drop_last): no state, no worker count. Workers only decide who
computes a batch, never what is in it, so the batches are the same for any num_workers.

Shuffles
  * ``"global"``: a full permutation of all samples (numpy's PCG64 seeded with
    (seed, epoch)).
  * ``"block"``: quasi-random and shard-aware, for data larger than RAM. Each shard is
    cut into blocks of ``block_size`` consecutive records; the blocks are permuted and
    taken ``window`` at a time; the samples of one window are shuffled together. A
    stretch of the order therefore reads only ``window`` blocks, each a contiguous run
    of one shard file.
  * ``None``/``False``: storage order.

Ranks: the epoch order is cut into ``world_size`` contiguous parts (contiguous keeps
block-shuffled reads local) whose sizes differ by at most one sample. Every rank yields the
SAME number of batches (a DDP job never waits for a rank that has run out):
  * ``drop_last=True``: every rank takes ``n // world_size`` samples rounded down to whole
    batches (each sample at most once; the remainder is not read this epoch);
  * ``drop_last=False``: every sample exactly once; each rank's part is cut into full batches
    and one last partial batch. Where one rank's part is a whole number of batches and
    another's is one sample more (so it would get one batch more), the shorter part's last
    full batch is split in two halves instead, so the counts agree (with batch_size 1 the
    shorter rank's last batch is empty; a rank with no sample at all yields empty batches).
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("dlpack_io.reader.batch.loader")  # the Loader's warnings, one logger

SHUFFLES = ("global", "block", None)
DEFAULT_BLOCK_SIZE = 256
DEFAULT_WINDOW = 16


def check_shuffle(shuffle):
    """Normalise ``shuffle`` (True -> "global", False/"none" -> None); raise on anything else."""
    if shuffle is True:
        return "global"
    if shuffle is False or shuffle == "none":
        return None
    if shuffle not in SHUFFLES:
        raise ValueError(f"shuffle={shuffle!r}: expected 'global', 'block', True or "
                         f"False/None/'none'")
    return shuffle


def _generator(seed: int, epoch: int, salt: int) -> np.random.Generator:
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed {seed} and epoch {epoch} must be >= 0")
    return np.random.default_rng([int(seed), int(epoch), salt])


def shard_blocks(shard_sizes, block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the blocks: runs of <= block_size records inside one shard."""
    if block_size < 1:
        raise ValueError(f"block_size {block_size}: expected >= 1")
    sizes = np.asarray(shard_sizes, dtype=np.int64)
    firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(sizes) else sizes
    per_shard = -(-sizes // block_size)
    shard_of = np.repeat(np.arange(len(sizes)), per_shard)
    within = np.arange(per_shard.sum()) - np.repeat(np.cumsum(per_shard) - per_shard, per_shard)
    starts = firsts[shard_of] + within * block_size
    lengths = np.minimum(block_size, sizes[shard_of] - within * block_size)
    return starts.astype(np.int64), lengths.astype(np.int64)


def _concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """np.concatenate([arange(s, s + l) for s, l in zip(starts, lengths)]), vectorized."""
    total = int(lengths.sum())
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.arange(total, dtype=np.int64) + offsets


def block_order(shard_sizes, seed: int, epoch: int, block_size: int = DEFAULT_BLOCK_SIZE,
                window: int = DEFAULT_WINDOW) -> np.ndarray:
    """The quasi-random epoch order of the ``"block"`` shuffle (see the module doc)."""
    if window < 1:
        raise ValueError(f"window {window}: expected >= 1 blocks")
    rng = _generator(seed, epoch, 1)
    starts, lengths = shard_blocks(shard_sizes, block_size)
    perm = rng.permutation(len(starts))
    order = _concat_ranges(starts[perm], lengths[perm])
    window_len = np.add.reduceat(lengths[perm], np.arange(0, len(perm), window)) \
        if len(perm) else np.zeros(0, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(window_len)])
    for a, b in zip(bounds[:-1], bounds[1:]):
        rng.shuffle(order[a:b])
    return order


def epoch_order(num_samples: int, shuffle, seed: int, epoch: int, shard_sizes=None,
                block_size: int = DEFAULT_BLOCK_SIZE, window: int = DEFAULT_WINDOW) -> np.ndarray:
    """All sample indices of one epoch in reading order (before the split across ranks)."""
    shuffle = check_shuffle(shuffle)
    if shuffle == "global":
        return _generator(seed, epoch, 0).permutation(num_samples).astype(np.int64)
    if shuffle == "block":
        sizes = [num_samples] if shard_sizes is None else shard_sizes
        if sum(sizes) != num_samples:
            raise ValueError(f"shard sizes add up to {sum(sizes)}, not {num_samples} samples")
        return block_order(sizes, seed, epoch, block_size, window)
    return np.arange(num_samples, dtype=np.int64)


def rank_bounds(num_samples: int, rank: int, world_size: int, batch_size: int,
                drop_last: bool) -> tuple[int, int]:
    """[start, end) of ``rank``'s contiguous part of the epoch order."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} not in [0, world_size={world_size})")
    if drop_last:
        per_rank = num_samples // world_size
        start = rank * per_rank
        return start, start + per_rank // batch_size * batch_size
    return rank * num_samples // world_size, (rank + 1) * num_samples // world_size


def batches_per_rank(num_samples: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """How many batches EVERY rank yields for ``num_samples`` samples (see the module doc)."""
    if drop_last:
        return num_samples // world_size // batch_size
    largest = -(-num_samples // world_size)
    return -(-largest // batch_size)


def batch_bounds(part_size: int, batches: int, batch_size: int) -> np.ndarray:
    """``batches + 1`` boundaries cutting a rank's part of ``part_size`` samples into
    ``batches`` batches: full ones, then the remainder; a part one batch short splits its
    last full batch in two halves (see the module doc)."""
    sizes = np.full(part_size // batch_size, batch_size, dtype=np.int64)
    if part_size % batch_size:
        sizes = np.append(sizes, part_size % batch_size)
    if len(sizes) > batches:
        raise ValueError(f"{part_size} samples make more than {batches} batches of {batch_size}")
    if len(sizes) < batches and len(sizes) and sizes[-1] > 1:
        last = int(sizes[-1])
        sizes = np.concatenate([sizes[:-1], [last - last // 2, last // 2]])
    sizes = np.append(sizes, np.zeros(batches - len(sizes), dtype=np.int64))
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def rank_part(sequence: np.ndarray, rank: int, world_size: int, batch_size: int,
              drop_last: bool) -> tuple[np.ndarray, np.ndarray]:
    """(rank's samples in order, batch boundaries within them) for a whole sequence."""
    n = len(sequence)
    start, end = rank_bounds(n, rank, world_size, batch_size, drop_last)
    total = batches_per_rank(n, world_size, batch_size, drop_last)
    return sequence[start:end], batch_bounds(end - start, total, batch_size)


def rank_order(num_samples: int, *, shuffle, seed: int, epoch: int, rank: int = 0,
               world_size: int = 1, batch_size: int = 1, drop_last: bool = False,
               shard_sizes=None, block_size: int = DEFAULT_BLOCK_SIZE,
               window: int = DEFAULT_WINDOW) -> np.ndarray:
    """The samples ``rank`` reads in ``epoch``, in order (see the module doc)."""
    order = epoch_order(num_samples, shuffle, seed, epoch, shard_sizes, block_size, window)
    start, end = rank_bounds(num_samples, rank, world_size, batch_size, drop_last)
    return order[start:end]


def num_batches(num_rank_samples: int, batch_size: int, drop_last: bool) -> int:
    """How many batches ``num_rank_samples`` samples make on their own."""
    if drop_last:
        return num_rank_samples // batch_size
    return -(-num_rank_samples // batch_size)


def batch_slice(k: int, num_rank_samples: int, batch_size: int) -> slice:
    """Positions of batch ``k`` within a rank's order (plain cut, for reports)."""
    return slice(k * batch_size, min((k + 1) * batch_size, num_rank_samples))


def worker_batches(total_batches: int, worker: int, num_workers: int,
                   start: int = 0) -> range:
    """Batches worker ``worker`` computes (round robin from batch ``start``)."""
    if not 0 <= worker < max(num_workers, 1):
        raise ValueError(f"worker {worker} not in [0, {num_workers})")
    return range(start + worker, total_batches, max(num_workers, 1))


def _env_int(name: str):
    import os

    value = os.environ.get(name)
    try:
        return None if value in (None, "") else int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def resolve_world(rank, world_size) -> tuple[int, int]:
    """(rank, world_size): explicit values, else torch.distributed's when it is initialised,
    else torchrun's RANK / WORLD_SIZE environment variables, else (0, 1)."""
    if rank is None or world_size is None:
        dist_rank, dist_world = None, None
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                dist_rank, dist_world = dist.get_rank(), dist.get_world_size()
        except ImportError:
            pass
        if dist_rank is None:
            dist_rank, dist_world = _env_int("RANK"), _env_int("WORLD_SIZE")
        rank = (dist_rank or 0) if rank is None else rank
        world_size = (dist_world or 1) if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank}, world_size {world_size}: expected 0 <= rank < "
                         f"world_size")
    return int(rank), int(world_size)


def warn_short_share(part, num_samples: int, bounds, rank: int, world_size: int,
                     batch_size: int) -> None:
    """Log (once per epoch) when this rank's share of ``num_samples`` makes no batch, or
    only some empty ones (every rank yields the same number of batches)."""
    total = len(bounds) - 1
    if total == 0 and num_samples:
        log.warning("Loader: rank %d of %d gets %d of %d samples, fewer than one batch of "
                    "%d with drop_last=True: this epoch yields nothing on this rank",
                    rank, world_size, len(part), num_samples, batch_size)
    if total and int(np.min(np.diff(bounds))) == 0:
        log.warning("Loader: rank %d of %d has too few samples to fill all %d batches: "
                    "some are empty, so every rank yields the same number",
                    rank, world_size, total)


def recheck_world(given, rank: int, world_size: int) -> tuple[int, int]:
    """(rank, world_size) resolved again from ``given`` (the Loader's arguments) when an
    epoch starts; logs when it differs from ``rank``/``world_size`` resolved at
    construction (torch.distributed initialised after the Loader was built)."""
    now = resolve_world(*given)
    if now != (rank, world_size):
        log.warning("Loader: rank/world_size changed from %d/%d at construction to %d/%d "
                    "(torch.distributed initialised after the Loader was built); using "
                    "%d/%d", rank, world_size, *now, *now)
    return now

