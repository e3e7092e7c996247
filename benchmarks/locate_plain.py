"""Cost of the retired-record map on a data set WITHOUT retired records: Dataset.locate
and Dataset.lookup as they were before ``--replace-changed`` (pre), as merged (locate
through record_of(): one more method call per sample) and as now (the map inlined).
Interleaved pre / merged / now per round; medians of the rounds.

    python -m benchmarks.locate_plain [DATASET] [--rounds 15]   (no DATASET: a synthetic one)
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import timeit

import numpy as np

from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt


class Pre(Dataset):
    """locate / lookup / len as before the retired map (commit 056e9ad)."""

    def __len__(self):
        return self.manifest["num_samples"]

    def locate(self, i):
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        i %= n
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        return k, i - int(self._starts[k])

    def lookup(self, indices):
        idx = np.asarray(indices, dtype=np.int64)
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(indices)
        shard_ids = np.searchsorted(self._starts, idx, side="right") - 1
        local = idx - self._starts[shard_ids]
        entries = np.empty(idx.shape, dtype=fmt.INDEX_DTYPE)
        for k in np.unique(shard_ids):
            mask = shard_ids == k
            entries[mask] = self._checked_index(int(k))[local[mask]]
        return shard_ids, local, entries


class Merged(Dataset):
    """locate as merged from the branch ``replace`` (through record_of)."""

    def locate(self, i):
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        i = self.record_of(i % n)
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        return k, i - int(self._starts[k])


def _dataset() -> str:
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    root = tempfile.mkdtemp(prefix="locate-plain-")
    make_image_folder(f"{root}/src", 512, 4, seed=1, size=(24, 32))
    convert(f"{root}/src", f"{root}/ds", shard_size="64KB", workers=1, progress=False,
            mode="raw", size=8)
    return f"{root}/ds"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", nargs="?")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    path = args.dataset or _dataset()
    sets = {"pre": Pre(path), "merged": Merged(path), "now": Dataset(path)}
    assert sets["now"]._records is None, "this measures a data set without retired records"
    n = len(sets["now"])
    idx = list(range(0, n, max(1, n // 256)))
    batch = np.random.default_rng(0).permutation(n)[:256]
    loc = {k: [] for k in sets}
    look = {k: [] for k in ("pre", "now")}
    for _ in range(args.rounds):
        for name, ds in sets.items():
            t = min(timeit.repeat(lambda: [ds.locate(i) for i in idx], number=50, repeat=3))
            loc[name].append(t / (50 * len(idx)) * 1e9)
            if name in look:
                t = min(timeit.repeat(lambda: ds.lookup(batch), number=200, repeat=3))
                look[name].append(t / 200 * 1e6)
    med = {k: statistics.median(v) for k, v in loc.items()}
    print(f"{n} samples, {len(sets['now'].shards)} shards, {args.rounds} rounds (medians)")
    print(f"locate ns/sample: pre {med['pre']:.0f}  merged {med['merged']:.0f}  now "
          f"{med['now']:.0f}   merged/pre {med['merged'] / med['pre']:.3f}  now/pre "
          f"{med['now'] / med['pre']:.3f}")
    lp, ln = statistics.median(look["pre"]), statistics.median(look["now"])
    print(f"lookup(256) us: pre {lp:.1f}  now {ln:.1f}   now/pre {ln / lp:.3f}")
    with open("/proc/loadavg") as f:
        print("loadavg", f.read().strip())


if __name__ == "__main__":
    main()
