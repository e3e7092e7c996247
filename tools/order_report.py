"""What a rank's epoch will read, and how well its batches mix shards and classes.

``order_report(path, seed=..., world_size=...)`` returns a plain dict (the CLI's
``dlpack inspect DST --order`` prints it with :func:`format_order_report`). The shuffle
quality figure compares, per batch, the number of distinct shards and classes with the
number a perfect shuffle (a uniformly random batch) would give on average:

    E[distinct groups] = sum over groups g of 1 - C(N - n_g, B) / C(N, B)

for a batch of B samples out of N, group g holding n_g of them. A ratio near 1 means
"as mixed as a global shuffle"; a block shuffle trades some of it for local reads.
"""
from __future__ import annotations

import math

import numpy as np

from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch.buckets import plan_ranks

SHUFFLES = ("global", "block", None)


def expected_distinct(group_sizes, batch: int) -> float:
    """Mean number of distinct groups in a uniformly random batch of ``batch`` samples."""
    sizes = np.asarray([s for s in group_sizes if s > 0], dtype=np.float64)
    n = float(sizes.sum())
    if batch <= 0 or n == 0:
        return 0.0
    batch = min(batch, int(n))
    lg = math.lgamma
    # C(N - n_g, B) / C(N, B) = exp(lgamma terms), zero when N - n_g < B
    miss = [math.exp(lg(n - s + 1) - lg(n - s - batch + 1) - lg(n + 1) + lg(n - batch + 1))
            if n - s >= batch else 0.0 for s in sizes]
    return float(len(sizes) - sum(miss))


def _per_batch_distinct(groups: np.ndarray, batch: int) -> np.ndarray:
    """Distinct values of ``groups`` within each consecutive run of ``batch`` entries."""
    full = len(groups) // batch * batch
    if full == 0:
        return np.array([len(np.unique(groups))]) if len(groups) else np.zeros(0)
    blocks = np.sort(groups[:full].reshape(-1, batch), axis=1)
    return 1 + (np.diff(blocks, axis=1) != 0).sum(axis=1)


def _mixing(shard_of, label_of, order, batch, shard_sizes, class_counts) -> dict:
    shards = _per_batch_distinct(shard_of[order], batch)
    classes = _per_batch_distinct(label_of[order], batch)
    perfect_s = expected_distinct(shard_sizes, batch)
    perfect_c = expected_distinct(class_counts, batch)
    mean_s = float(shards.mean()) if shards.size else 0.0
    mean_c = float(classes.mean()) if classes.size else 0.0
    return {"shards_per_batch": mean_s, "perfect_shards_per_batch": perfect_s,
            "shard_mix": mean_s / perfect_s if perfect_s else 1.0,
            "classes_per_batch": mean_c, "perfect_classes_per_batch": perfect_c,
            "class_mix": mean_c / perfect_c if perfect_c else 1.0}


def _first_batches(ds, mine, count, bounds, shard_of, local, label_of) -> list:
    out = []
    for k in range(count):
        part = mine[bounds[k]:bounds[k + 1]]
        out.append({"batch": k, "size": len(part),
                    "samples": [{"sample": int(i), "shard": ds.manifest["shards"][shard_of[i]]["name"],
                                 "record": int(local[i]), "label": int(label_of[i])}
                                for i in part[:4]]})
    return out


def bucket_report(bucketing, heights, widths, mine, bounds, batch_size: int) -> dict:
    """What a bucketing makes of a rank's epoch: for aspect buckets the samples of every
    bucket (the whole data set's and this rank's batches), for a token budget how full the
    batches are and how much of a padded batch is padding."""
    counts = np.diff(bounds)
    if hasattr(bucketing, "bucket_of"):
        every = np.bincount(bucketing.bucket_of(heights, widths), minlength=len(bucketing.sizes))
        first = [int(mine[a]) for a in bounds[:-1][counts > 0]]
        per_batch = np.bincount(bucketing.bucket_of(heights[first], widths[first]),
                                minlength=len(bucketing.sizes)) if first else every * 0
        return {"kind": "aspect", "buckets": [
            {"size": list(size), "samples": int(every[b]), "rank_batches": int(per_batch[b])}
            for b, size in enumerate(bucketing.sizes) if every[b]]}
    sizes = bucketing.sizes_of(heights[mine], widths[mine])
    tokens = (sizes[:, 0] // bucketing.patch) * (sizes[:, 1] // bucketing.patch)
    fills, padded = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            fills.append(tokens[a:b].sum() / bucketing.tokens)
            box = sizes[a:b].max(axis=0)
            padded.append(1 - (sizes[a:b, 0] * sizes[a:b, 1]).sum() / ((b - a) * box[0] * box[1]))
    return {"kind": "tokens", "tokens": bucketing.tokens, "patch": bucketing.patch,
            "mean_fill": float(np.mean(fills)) if fills else 0.0,
            "min_fill": float(np.min(fills)) if fills else 0.0,
            "mean_samples": float(np.mean(counts)) if len(counts) else 0.0,
            "padding": float(np.mean(padded)) if padded else 0.0}


def order_report(path, *, seed: int = 0, epoch: int = 0, world_size: int = 1, rank: int = 0,
                 batch_size: int = 256, shuffle="global", drop_last: bool = False,
                 block_size: int = order_mod.DEFAULT_BLOCK_SIZE,
                 window: int = order_mod.DEFAULT_WINDOW, show: int = 3, buckets=None) -> dict:
    """Describe rank ``rank``'s epoch ``epoch`` of the data set at ``path`` (a dict).

    Includes the first ``show`` batches (sample, shard, record, label of their first
    samples), how many samples it reads from each shard, and the shard/class mixing of
    every shuffle mode for comparison. The batches are the Loader's (order.rank_part, or
    with ``buckets`` the bucketed split of reader/batch/buckets.py, then described by
    :func:`bucket_report`), and ``drop_last`` defaults to the Loader's default (False).
    """
    from dlpack_io.reader import Dataset

    ds = Dataset(path)
    n = len(ds)
    sizes = ds.shard_sizes
    shard_of, local, entries = ds.lookup(np.arange(n))
    label_of = entries["label"].astype(np.int64)
    kw = dict(seed=seed, epoch=epoch, rank=rank, world_size=world_size, batch_size=batch_size,
              drop_last=drop_last, shard_sizes=sizes, block_size=block_size, window=window)
    epoch_order = order_mod.epoch_order(n, shuffle, seed, epoch, sizes, block_size, window)
    hs, ws = entries["height"].astype(np.int64), entries["width"].astype(np.int64)
    if buckets is None:
        mine, bounds = order_mod.rank_part(epoch_order, rank, world_size, batch_size, drop_last)
    else:
        positions, bounds = plan_ranks(buckets, epoch_order, lambda q: (hs[q], ws[q]),
                                       world_size, batch_size, drop_last)[rank]
        mine = epoch_order[positions]
    mine = mine[:bounds[-1]]
    batches = len(bounds) - 1
    first = _first_batches(ds, mine, min(show, batches), bounds, shard_of, local, label_of)
    per_shard = np.bincount(shard_of[mine], minlength=len(sizes))
    counts = ds.manifest["class_counts"]
    if counts and len(ds) != ds.manifest["num_samples"]:  # retired records: count samples
        counts = np.bincount(label_of, minlength=len(counts))[:len(counts)].tolist()
    quality = {(s or "none"): _mixing(shard_of, label_of, order_mod.rank_order(n, shuffle=s, **kw),
                               batch_size, sizes, counts) for s in SHUFFLES}
    return {"dataset": ds.path, "num_samples": n, "num_shards": len(sizes),
            "num_classes": len(ds.classes), "seed": seed, "epoch": epoch, "rank": rank,
            "world_size": world_size, "batch_size": batch_size, "drop_last": drop_last,
            "shuffle": order_mod.check_shuffle(shuffle) or "none", "block_size": block_size,
            "window": window, "rank_samples": int(len(mine)), "num_batches": int(batches),
            "first_batches": first,
            "buckets": None if buckets is None else bucket_report(buckets, hs, ws, mine,
                                                                  bounds, batch_size),
            "shards_read": {ds.manifest["shards"][k]["name"]: int(c)
                            for k, c in enumerate(per_shard) if c},
            "quality": quality}


def format_buckets(b) -> list:
    """Lines of :func:`bucket_report`'s dict (none without buckets)."""
    if not b:
        return []
    if b["kind"] == "tokens":
        return ["", f"token budget {b['tokens']} (patch {b['patch']}): batches "
                    f"{100 * b['mean_fill']:.1f}% full on average (the emptiest "
                    f"{100 * b['min_fill']:.1f}%), {b['mean_samples']:.1f} samples each, "
                    f"{100 * b['padding']:.1f}% of a padded batch is padding"]
    lines = ["", "aspect buckets (height x width): samples in the data set, batches of this rank"]
    top = max(x["samples"] for x in b["buckets"])
    for x in b["buckets"]:
        bar = "#" * max(1, round(30 * x["samples"] / top))
        lines.append(f"  {x['size'][0]:5d} x {x['size'][1]:<5d} {x['samples']:8d} "
                     f"{x['rank_batches']:6d}  {bar}")
    return lines


def format_order_report(report: dict) -> str:
    """Plain-text rendering of :func:`order_report`'s dict."""
    r = report
    lines = [f"{r['dataset']}: {r['num_samples']} samples in {r['num_shards']} shards, "
             f"{r['num_classes']} classes",
             f"rank {r['rank']} of {r['world_size']}, epoch {r['epoch']}, seed {r['seed']}, "
             f"shuffle {r['shuffle']}" + (f" (blocks of {r['block_size']}, windows of "
                                          f"{r['window']})" if r['shuffle'] == 'block' else ""),
             f"reads {r['rank_samples']} samples in {r['num_batches']} batches of "
             f"{r['batch_size']} (drop_last={r['drop_last']}), from {len(r['shards_read'])} shards",
             ""]
    for b in r["first_batches"]:
        items = ", ".join(f"{s['sample']} ({s['shard']}#{s['record']}, class {s['label']})"
                          for s in b["samples"])
        lines.append(f"  batch {b['batch']} ({b['size']} samples): {items}, ...")
    lines += format_buckets(r.get("buckets"))
    lines += ["", "shuffle quality: distinct shards / classes per batch (perfect shuffle = "
                  "uniformly random batches)",
              f"  {'shuffle':8s} {'shards/batch':>14s} {'perfect':>9s} {'mix':>6s}   "
              f"{'classes/batch':>14s} {'perfect':>9s} {'mix':>6s}"]
    for name, q in r["quality"].items():
        mark = " <- this run" if name == r["shuffle"] else ""
        lines.append(f"  {name:8s} {q['shards_per_batch']:14.1f} {q['perfect_shards_per_batch']:9.1f} "
                     f"{q['shard_mix']:6.2f}   {q['classes_per_batch']:14.1f} "
                     f"{q['perfect_classes_per_batch']:9.1f} {q['class_mix']:6.2f}{mark}")
    return "\n".join(lines)
