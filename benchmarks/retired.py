"""What records retired by ``--replace-changed`` cost a reader: the manifest check and the
sample -> record map made when a Dataset opens, and the per-batch gather, for an
ImageNet-sized data set (1,281,167 records) with 10,000 records replaced.

    python -m benchmarks.retired [--records 1281167] [--replaced 10000] [--repeats 7]

Prints JSON: medians in milliseconds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

from dlpack_io.reader import format as fmt


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 4)


def main(argv=None) -> None:
    """Run the benchmark and print its JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_281_167)
    p.add_argument("--replaced", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args(argv)
    n, k = a.records, a.replaced
    rng = np.random.default_rng(0)
    old = np.sort(rng.choice(n - k, size=k, replace=False))
    pairs = [[int(o), n - k + i] for i, o in enumerate(old)]  # one append replacing k
    manifest = {"version": fmt.RETIRING_VERSION, "num_samples": n, fmt.RETIRED_KEY: pairs}
    records = fmt.sample_records(n, pairs)
    batch = rng.integers(0, n - k, 256)
    print(json.dumps({
        "records": n, "replaced": k, "repeats": a.repeats,
        "check_retired_ms": _median_ms(lambda: fmt.check_retired(manifest, "bench"), a.repeats),
        "sample_records_ms": _median_ms(lambda: fmt.sample_records(n, pairs), a.repeats),
        "gather_256_ms": _median_ms(lambda: records[batch], 101),
        "loadavg": open("/proc/loadavg").read().split()[:3], "cores": len(os.sched_getaffinity(0)),
    }, indent=1))


if __name__ == "__main__":
    main()
