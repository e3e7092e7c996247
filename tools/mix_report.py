"""What a rank's epoch of a ``Mixture`` reads: each set's share, and how evenly the sets
mix within batches (``dlpack inspect A --order --mix B --weights 0.7,0.3``).

``mixture_report(paths, weights=...)`` returns a plain dict (``format_mixture_report``
renders it). The order is the Loader's (reader/batch/sources.py: ``mixture_order``, cut across ranks by
order.rank_part). Mixing quality, per set s of weight w and per batch of B samples: the
mean absolute difference between the samples of s in the batch and ``w * B``, beside what
independent random draws would give on average, ``E|Binomial(B, w) - B w|`` (exact sum). A
ratio well below 1 means the batches hold the shares more evenly than random draws; the
longest run of one set shows how long the order stays on one set.
"""
from __future__ import annotations

import math

import numpy as np

from dlpack_io.reader.batch import sources
from dlpack_io.reader.batch import order as order_mod


def random_deviation(batch: int, w: float) -> float:
    """E|X - batch*w| for X ~ Binomial(batch, w): the mean miss of independent draws."""
    if batch <= 0 or w <= 0 or w >= 1:
        return 0.0
    k = np.arange(batch + 1)
    logp = (np.vectorize(math.lgamma)(batch + 1) - np.vectorize(math.lgamma)(k + 1)
            - np.vectorize(math.lgamma)(batch - k + 1) + k * math.log(w)
            + (batch - k) * math.log1p(-w))
    return float((np.exp(logp) * np.abs(k - batch * w)).sum())


def _longest_runs(sets: np.ndarray, count: int) -> list[int]:
    """Per set number, the longest stretch of consecutive positions holding only it."""
    best = [0] * count
    if not len(sets):
        return best
    edges = np.flatnonzero(np.diff(sets)) + 1
    starts = np.concatenate([[0], edges])
    lengths = np.diff(np.concatenate([starts, [len(sets)]]))
    for s, n in zip(sets[starts].tolist(), lengths.tolist()):
        best[s] = max(best[s], n)
    return best


def _batch_shares(sets, bounds, count: int, weights) -> tuple[np.ndarray, list[dict]]:
    per_batch = np.array([np.bincount(sets[a:b], minlength=count)
                          for a, b in zip(bounds[:-1], bounds[1:])]).reshape(-1, count)
    sizes = np.diff(bounds)
    full = sizes == sizes.max(initial=0)  # a short last batch would skew the figures
    quality = []
    for s, w in enumerate(weights):
        got = per_batch[full, s]
        miss = float(np.abs(got - w * sizes[full]).mean()) if got.size else 0.0
        rand = random_deviation(int(sizes.max(initial=0)), w)
        quality.append({"mean": float(got.mean()) if got.size else 0.0,
                        "min": int(got.min()) if got.size else 0,
                        "max": int(got.max()) if got.size else 0,
                        "target": w * float(sizes.max(initial=0)), "deviation": miss,
                        "random_deviation": rand,
                        "vs_random": miss / rand if rand else 0.0})
    return per_batch, quality


def mixture_report(paths, *, weights=None, samples_per_epoch=None, epoch_rule=None,
                   seed: int = 0, epoch: int = 0, world_size: int = 1, rank: int = 0,
                   batch_size: int = 256, shuffle="global", drop_last: bool = False,
                   block_size: int = order_mod.DEFAULT_BLOCK_SIZE,
                   window: int = order_mod.DEFAULT_WINDOW, show: int = 3) -> dict:
    """Describe rank ``rank``'s epoch ``epoch`` of the Mixture of the data sets ``paths``
    (``weights`` etc. as ``Mixture``'s); a dict (see the module doc)."""
    from dlpack_io.reader import Dataset, Mixture

    mix = Mixture([Dataset(p) for p in paths], weights, samples_per_epoch=samples_per_epoch,
                  epoch=epoch_rule)
    order = sources.mixture_order(mix.sizes, mix.counts, mix.offsets, mix.total,
                                   shuffle=shuffle, seed=seed, epoch=epoch,
                                   shard_sizes=mix.shard_sizes, block_size=block_size,
                                   window=window)
    mine, bounds = order_mod.rank_part(order, rank, world_size, batch_size, drop_last)
    mine = mine[:bounds[-1]]
    sets, local, _ = mix.split(mine)
    per_batch, quality = _batch_shares(sets, bounds, len(paths), mix.weights)
    runs = _longest_runs(sets, len(paths))
    rank_counts = np.bincount(sets, minlength=len(paths)).tolist()
    return {"sets": [{"path": str(ds.path), "samples": n, "weight": w, "per_epoch": q,
                      "read_by_rank": c, "passes": q / n if n else 0.0, "longest_run": r,
                      "per_batch": qual}
                     for ds, n, w, q, c, r, qual in zip(mix.datasets, mix.sizes, mix.weights,
                                                        mix.counts, rank_counts, runs, quality)],
            "samples_per_epoch": mix.samples_per_epoch, "seed": seed, "epoch": epoch,
            "rank": rank, "world_size": world_size, "batch_size": batch_size,
            "drop_last": drop_last, "shuffle": order_mod.check_shuffle(shuffle) or "none",
            "rank_samples": int(len(mine)), "num_batches": int(len(bounds) - 1),
            "first_batches": [{"batch": k, "per_set": per_batch[k].tolist(),
                               "samples": [[int(s), int(i)] for s, i in
                                           zip(sets[bounds[k]:bounds[k + 1]][:4],
                                               local[bounds[k]:bounds[k + 1]][:4])]}
                              for k in range(min(show, len(bounds) - 1))]}


def format_mixture_report(report: dict) -> str:
    """Plain-text rendering of :func:`mixture_report`'s dict."""
    r = report
    lines = [f"mixture of {len(r['sets'])} data sets, {r['samples_per_epoch']} samples per "
             f"epoch; rank {r['rank']} of {r['world_size']}, epoch {r['epoch']}, seed "
             f"{r['seed']}, shuffle {r['shuffle']}",
             f"reads {r['rank_samples']} samples in {r['num_batches']} batches of "
             f"{r['batch_size']} (drop_last={r['drop_last']})", ""]
    for k, s in enumerate(r["sets"]):
        q = s["per_batch"]
        lines.append(f"  set {k}: {s['path']}: {s['samples']} samples, weight {s['weight']:.4g}"
                     f", {s['per_epoch']} per epoch ({s['passes']:.2f} passes), this rank "
                     f"{s['read_by_rank']}")
        lines.append(f"         per batch {q['mean']:.1f} (min {q['min']}, max {q['max']}, "
                     f"target {q['target']:.1f}); off by {q['deviation']:.2f} on average, "
                     f"random draws {q['random_deviation']:.2f} ({q['vs_random']:.2f}x); "
                     f"longest run {s['longest_run']}")
    lines.append("")
    for b in r["first_batches"]:
        items = ", ".join(f"set {s} #{i}" for s, i in b["samples"])
        lines.append(f"  batch {b['batch']}: per set {b['per_set']}: {items}, ...")
    return "\n".join(lines)
