"""``Mixture``: several packed data sets read as one, each by its share of every epoch.

    mix = Mixture([Dataset("packed/a"), Dataset("s3://bucket/b")], weights=[0.7, 0.3],
                  samples_per_epoch=100_000)          # or epoch="largest" / "smallest" / "sum"
    loader = Loader(mix, batch_size=256, ...)

What the Loader sees is the face of a Dataset: a virtual concatenation of the sets (their
shards one list, ``lookup``, ``where``, ``check_unchanged``, ``start_prefetch``), indexed by
*virtual indices* (reader/batch/sources.py: ``copy * total + offset[set] + index``), and
an epoch order drawn there (``mixture_order``). Shares are fixed at construction
(``counts``); docs/loader.md ("Mixing data sets") has the rules."""
from __future__ import annotations

import logging
import math
import numbers
import os
import time
from fractions import Fraction

import numpy as np

from dlpack_io.reader.dataset import Dataset

# A Mixture's labels: each set's own (the default), or remapped onto one class list.
#
# ``classes=None`` keeps every set's labels as it stored them: label 3 of set 0 and label 3
# of set 1 are both 3, whatever their names (right for sets packed with the same class list,
# or when the training loop tells sets apart itself). ``classes="union"`` builds one list:
# the first set's classes in their order, then each later set's new names in its order, so
# set 0's labels never change; the other sets' labels are remapped by name. ``classes=[...]``
# is an explicit list that must name every class of every set. Unlabelled samples (-1) stay
# -1 in every mode.

log = logging.getLogger("dlpack_io.reader.mixture")


def _keep(datasets) -> list[str]:
    """The class list of ``classes=None``: the longest set's, when every other set's list is
    a prefix of it; otherwise one name per label number, the sets' names joined by '|'."""
    lists = [list(ds.classes) for ds in datasets]
    longest = max(lists, key=len)
    if all(c == longest[:len(c)] for c in lists):
        return longest
    log.warning("Mixture: the sets name their labels differently (%s); labels are kept as "
                "each set stored them. Pass classes='union' to remap them by name",
                "; ".join(f"set {s}: {c[:3]}{'...' if len(c) > 3 else ''}"
                          for s, c in enumerate(lists)))
    return ["|".join(dict.fromkeys(c[k] for c in lists if k < len(c)))
            for k in range(len(longest))]


def _union(datasets) -> list[str]:
    names: dict[str, None] = {}
    for ds in datasets:
        names.update(dict.fromkeys(ds.classes))
    return list(names)


def resolve_classes(datasets, classes) -> tuple[list[str], list]:
    """(the mixture's class names, per set a label lookup table or None for unchanged)."""
    if classes is None:
        return _keep(datasets), [None] * len(datasets)
    if isinstance(classes, str):
        if classes != "union":
            raise ValueError(f"Mixture classes={classes!r}: expected None (keep each set's "
                             f"labels), 'union' or a list of class names")
        names = _union(datasets)
    else:
        names = list(classes)
        if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            raise ValueError(f"Mixture classes={classes!r}: expected distinct class names")
    where = {n: k for k, n in enumerate(names)}
    tables = []
    for s, ds in enumerate(datasets):
        missing = [n for n in ds.classes if n not in where]
        if missing:
            raise ValueError(f"Mixture set {s} ({ds.path}): class {missing[0]!r} is not in "
                             f"classes= ({len(names)} names); add it, or pass "
                             f"classes='union'")
        table = np.array([where[n] for n in ds.classes], dtype=np.int64)
        tables.append(None if np.array_equal(table, np.arange(len(table))) else table)
    return names, tables


def remap(labels: np.ndarray, table, where: str) -> np.ndarray:
    """``labels`` (one set's, as stored) through ``table``; -1 (no label) stays -1.
    ValueError naming ``where`` (the set) for a label past the set's class list."""
    if table is None or not len(labels):
        return labels
    labelled = labels >= 0
    if labelled.any() and int(labels[labelled].max()) >= len(table):
        raise ValueError(f"{where}: label {int(labels[labelled].max())} but the set names "
                         f"only {len(table)} classes: its manifest and shards disagree")
    out = labels.copy()
    out[labelled] = table[labels[labelled].astype(np.int64)]
    return out


# The remote prefetch of a ``Mixture``: one prefetch per s3:// set, one handle over them.
#
# The Loader hands ``start_prefetch`` this rank's upcoming batches of virtual indices; each
# remote set gets, per batch, the distinct records of that batch that are its own (an empty
# list where the batch holds none of it), so batch ``k`` of the mixture is batch ``k`` of
# every set's prefetch and ``wait``/``ready``/``release`` go to all of them. A worker's
# remote shard finds its own set's prefetch as it does for a single data set.

def start_sets(mixture, batches, mode=None):
    """A MixturePrefetch over the remote sets of ``mixture`` for ``batches``, or None."""
    remote = [s for s, ds in enumerate(mixture.datasets) if ds.is_remote]
    if not remote:
        return None
    split = [mixture.split(b)[:2] for b in batches]
    handles = []
    try:
        for s in remote:
            mine = [np.unique(local[sets == s]) for sets, local in split]
            handles.append(mixture.datasets[s].start_prefetch(mine, mode=mode))
    except BaseException:
        for h in handles:
            h.close()
        raise
    return MixturePrefetch(handles)


class MixturePrefetch:
    """``Prefetch``'s protocol (reader/remote/prefetch.py) over several sets' prefetches."""

    def __init__(self, handles):
        self.handles = list(handles)

    @property
    def stats(self) -> list[dict]:
        """Each remote set's prefetch statistics, in set order."""
        return [h.stats for h in self.handles]

    def wait(self, k: int, timeout: float | None = None) -> None:
        """Block until batch ``k``'s records of every remote set are in the cache;
        TimeoutError once ``timeout`` seconds have passed in all (one deadline shared by
        the sets, not ``timeout`` each); None: each set's own store deadline."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for h in self.handles:
            # a set reached with no time left still answers: ready now, or TimeoutError
            h.wait(k, None if deadline is None else max(0.0, deadline - time.monotonic()))

    def ready(self, k: int) -> bool:
        """Non-blocking: batch ``k``'s records of every remote set are in the cache."""
        return all(h.ready(k) for h in self.handles)

    def release(self, k: int) -> None:
        """Batch ``k`` was delivered: each set may evict what no later batch needs."""
        for h in self.handles:
            h.release(k)

    def close(self) -> None:
        """Stop every set's prefetch; idempotent."""
        for h in self.handles:
            h.close()


EPOCH_RULES = ("sum", "largest", "smallest")
MAX_SAMPLES_PER_EPOCH = 2**40   # as statecheck's epoch bound: far beyond any run
_INDEX_LIMIT = 2**62            # virtual indices stay inside int64
ORDER_BYTES_PER_SAMPLE = 64     # an epoch's order at its peak (batch/sources.py: 48 measured)


def memory_bytes() -> int:
    """This machine's physical memory (what one epoch's order must fit in)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not told: assume a large machine
        return 2**40


def _check_weights(weights, count: int) -> list[Fraction]:
    if len(weights) != count:
        raise ValueError(f"Mixture: {len(weights)} weights for {count} data sets; give one "
                         f"weight per set")
    out = []
    for s, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) \
                or w < 0:
            raise ValueError(f"Mixture: weight {w!r} of set {s}: expected a finite number >= 0")
        # as written: 0.7 is 7/10 (not the binary float just below), so shares of decimal
        # weights round as the decimals say
        out.append(Fraction(w) if isinstance(w, numbers.Rational) else Fraction(str(float(w))))
    if sum(out) <= 0:
        raise ValueError(f"Mixture: weights {list(weights)} add up to 0; at least one set "
                         f"needs a positive weight")
    return [w / sum(out) for w in out]


def largest_remainder(weights, total: int) -> list[int]:
    """Integer shares of ``total`` for exact fractions ``weights`` (summing to 1): each set
    gets floor(w * total), and the samples left go one each to the sets with the largest
    remainders (ties: the lower set number first). The shares add up to ``total``."""
    exact = [w * total for w in weights]
    shares = [math.floor(e) for e in exact]
    by_remainder = sorted(range(len(shares)), key=lambda s: (-(exact[s] - shares[s]), s))
    for s in by_remainder[:total - sum(shares)]:
        shares[s] += 1
    return shares


def epoch_length(rule, weights, sizes) -> int:
    """Samples per epoch of an ``epoch=`` rule: "sum" all the sets' samples; "largest" the
    fewest samples for which every set's share covers the whole set (each sample read at
    least once; the set that takes longest to exhaust at its weight decides); "smallest"
    the most for which no set's share exceeds the set (nothing repeats; the set exhausted
    first decides)."""
    if rule not in EPOCH_RULES:
        raise ValueError(f"Mixture epoch={rule!r}: expected one of {EPOCH_RULES} or "
                         f"samples_per_epoch=<int>")
    if rule == "sum":
        return int(sum(sizes))
    ratios = [Fraction(n) / w for n, w in zip(sizes, weights) if w > 0]
    return int(max(math.ceil(r) for r in ratios)) if rule == "largest" else \
        int(min(math.floor(r) for r in ratios))


class Figures(list):
    """A list of per-set figures (a fresh copy: changing it changes no Mixture) that also
    compares equal to a tuple of the same values."""

    def __eq__(self, other):
        return list.__eq__(self, list(other) if isinstance(other, tuple) else other)

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None


class Mixture:
    """Data sets read as one: each epoch draws exactly ``counts[s]`` samples of set ``s``
    (``weights[s]`` of ``samples_per_epoch``, largest-remainder rounding), a set smaller
    than its share repeated, a larger one subsampled without replacement.

    ``datasets``: Dataset objects (or paths / URLs, opened with the defaults). ``weights``:
    one number >= 0 per set (normalised; default: proportional to the sets' sizes). Epoch
    length: ``samples_per_epoch=N`` or ``epoch=`` "sum" (default), "largest" or "smallest"
    (see ``epoch_length``). ``classes``: None keeps each set's labels,
    "union" or a list remaps them by name (reader/mixture.py).
    """

    def __init__(self, datasets, weights=None, *, samples_per_epoch=None, epoch=None,
                 classes=None, _resolved=None):
        if isinstance(datasets, (str, os.PathLike, Dataset)):
            raise TypeError(f"Mixture({datasets!r}): expected a list of data sets")
        self.datasets = [Dataset(ds) if isinstance(ds, (str, os.PathLike)) else ds
                         for ds in datasets]
        self._check_sets()
        self._sizes = tuple(len(ds) for ds in self.datasets)
        exact = _check_weights(list(self._sizes) if weights is None else list(weights),
                               len(self.datasets))
        self._weights = tuple(float(w) for w in exact)
        self.samples_per_epoch = self._length(samples_per_epoch, epoch, exact)
        self.epoch_rule = (epoch or "sum") if samples_per_epoch is None else None
        self._counts = tuple(largest_remainder(exact, self.samples_per_epoch))
        for s, (n, q) in enumerate(zip(self.sizes, self.counts)):
            if q and not n:
                raise ValueError(f"Mixture set {s} ({self.datasets[s].path}) is empty but its "
                                 f"weight asks {q} samples an epoch; give it weight 0")
        self.offsets = np.concatenate([[0], np.cumsum(self._sizes)[:-1]]).astype(np.int64)
        self.total = int(sum(self._sizes))
        copies = max((-(-q // n) for n, q in zip(self.sizes, self.counts) if n), default=1)
        if (copies + 1) * max(self.total, 1) >= _INDEX_LIMIT:
            raise ValueError(f"Mixture: {self.samples_per_epoch} samples per epoch repeat a set "
                             f"{copies} times over {self.total} samples: too many to number; "
                             f"ask fewer samples_per_epoch")
        # a worker process's copy takes the owner's labels (no second warning per worker)
        self.classes, self._tables = _resolved or resolve_classes(self.datasets, classes)
        self.shards = [sh for ds in self.datasets for sh in ds.shards]
        self._shard_offsets = np.concatenate(
            [[0], np.cumsum([len(ds.shards) for ds in self.datasets])]).astype(np.int64)
        self.fields = self._common_fields()
        self._args = (weights, samples_per_epoch, epoch, classes)

    def _check_sets(self) -> None:
        if not self.datasets:
            raise ValueError("Mixture: no data sets given; pass a list of Dataset objects")
        for s, ds in enumerate(self.datasets):
            if not isinstance(ds, Dataset):
                raise TypeError(f"Mixture set {s} is a {type(ds).__name__}; expected a "
                                f"dlpack_io.reader.Dataset (a Mixture does not nest)")
        if len({id(ds) for ds in self.datasets}) != len(self.datasets):
            raise ValueError("Mixture: the same Dataset object is listed twice; give it a "
                             "larger weight instead")

    def _length(self, samples_per_epoch, rule, exact) -> int:
        if samples_per_epoch is not None and rule is not None:
            raise ValueError(f"Mixture: samples_per_epoch={samples_per_epoch!r} and "
                             f"epoch={rule!r} both given; pass one of them")
        if samples_per_epoch is None:
            n = epoch_length("sum" if rule is None else rule, exact, self._sizes)
        elif isinstance(samples_per_epoch, bool) or \
                not isinstance(samples_per_epoch, numbers.Integral):
            raise ValueError(f"Mixture samples_per_epoch={samples_per_epoch!r}: expected an "
                             f"integer >= 1")
        else:
            n = int(samples_per_epoch)
        if not 1 <= n <= MAX_SAMPLES_PER_EPOCH:
            raise ValueError(f"Mixture: {n} samples per epoch (sets of {list(self._sizes)} "
                             f"samples): expected 1 to {MAX_SAMPLES_PER_EPOCH}")
        fits = memory_bytes() // ORDER_BYTES_PER_SAMPLE
        if n > fits:  # checked before anything of that length is allocated
            raise ValueError(f"Mixture: {n} samples per epoch (sets of {list(self._sizes)} "
                             f"samples): one epoch's order takes {ORDER_BYTES_PER_SAMPLE} bytes "
                             f"a sample, {n * ORDER_BYTES_PER_SAMPLE / 2**30:.0f} GiB, more than "
                             f"this machine's {memory_bytes() / 2**30:.1f} GiB of memory; ask "
                             f"at most {fits} samples_per_epoch (a longer run is more epochs)")
        return n

    def _common_fields(self) -> dict:
        """The fields every set has with the same schema (what a Loader may ask for)."""
        first = self.datasets[0].fields
        return {n: spec for n, spec in first.items()
                if all(ds.fields.get(n) == spec for ds in self.datasets[1:])}

    @property
    def sizes(self) -> "Figures":
        """Samples of each set."""
        return Figures(self._sizes)

    @property
    def weights(self) -> "Figures":
        """Each set's weight, normalised to sum to 1 (floats)."""
        return Figures(self._weights)

    @property
    def counts(self) -> "Figures":
        """Samples each set gives every epoch (they add up to ``samples_per_epoch``)."""
        return Figures(self._counts)

    # ---- the Dataset face the Loader reads ---------------------------------------------
    def __len__(self) -> int:
        """Samples one epoch draws (``samples_per_epoch``)."""
        return self.samples_per_epoch

    @property
    def path(self) -> str:
        """A description naming every set (error messages)."""
        return "Mixture(" + ", ".join(str(ds.path) for ds in self.datasets) + ")"

    @property
    def is_remote(self) -> bool:
        """True when any set is read from object storage."""
        return any(ds.is_remote for ds in self.datasets)

    @property
    def verify_checksums(self) -> bool:
        """Records are checked when any set asked for it (checking more is always safe)."""
        return any(ds.verify_checksums for ds in self.datasets)

    @property
    def shard_sizes(self) -> list[list[int]]:
        """Per set, the sample counts of its shards (the block shuffle's blocks)."""
        return [ds.shard_sizes for ds in self.datasets]

    def split(self, virtual) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(set numbers, indices within their set, repetition numbers) of virtual indices
        (those an epoch order and a Loader's batches hold); IndexError for one out of range."""
        v = np.asarray(virtual, dtype=np.int64)
        if v.size and int(v.min()) < 0:
            raise IndexError(f"{self.path}: virtual sample index {int(v.min())} is negative")
        reps, concat = np.divmod(v, max(self.total, 1))
        sets = np.searchsorted(self.offsets, concat, side="right") - 1
        return sets, concat - self.offsets[sets], reps

    def lookup(self, indices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As ``Dataset.lookup`` for virtual indices: (shard numbers in ``self.shards``,
        records within them, index entries with labels mapped through ``classes``)."""
        sets, local, _ = self.split(indices)
        shard_ids = np.empty(sets.shape, dtype=np.int64)
        records = np.empty(sets.shape, dtype=np.int64)
        entries = None
        for s in np.unique(sets).tolist():
            mask = sets == s
            k, j, e = self.datasets[s].lookup(local[mask])
            if entries is None:
                entries = np.empty(sets.shape, dtype=e.dtype)
            e["label"] = remap(e["label"], self._tables[s], f"Mixture set {s}")
            shard_ids[mask], records[mask], entries[mask] = k + self._shard_offsets[s], j, e
        if entries is None:  # an empty batch
            entries = self.datasets[0].lookup(np.zeros(0, dtype=np.int64))[2]
        return shard_ids, records, entries

    def where(self, i: int) -> str:
        """Human-readable location of virtual sample ``i`` (set, shard file, record)."""
        sets, local, reps = self.split([i])
        s = int(sets[0])
        again = f", repetition {int(reps[0])}" if reps[0] else ""
        return f"Mixture set {s}: {self.datasets[s].where(int(local[0]))}{again}"

    def check_unchanged(self, shard_ids=None) -> None:
        """As ``Dataset.check_unchanged``, for shard numbers of ``self.shards``."""
        ids = range(len(self.shards)) if shard_ids is None else np.unique(np.asarray(shard_ids))
        for k in ids:
            self.shards[int(k)].check_unchanged()

    def start_prefetch(self, batches, *, mode=None):
        """Start each remote set's prefetch of its samples of ``batches`` (virtual indices);
        a handle over them all, or None when every set is on local disk."""
        return start_sets(self, batches, mode)

    def close(self) -> None:
        """Release what the remote sets hold."""
        for ds in self.datasets:
            ds.close()

    def __getstate__(self):
        return {"datasets": self.datasets, "args": self._args,
                "resolved": (self.classes, self._tables)}

    def __setstate__(self, state):
        weights, samples, rule, classes = state["args"]
        self.__init__(state["datasets"], weights, samples_per_epoch=samples, epoch=rule,
                      classes=classes, _resolved=state.get("resolved"))

    def __repr__(self) -> str:
        sets = ", ".join(f"{ds.path!s} x{w:.3g} ({q} of {n})" for ds, w, q, n in
                         zip(self.datasets, self.weights, self.counts, self._sizes))
        return f"Mixture({sets}; {self.samples_per_epoch} samples per epoch)"
