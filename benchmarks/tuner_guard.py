"""What the Tuner itself costs per batch (autotune.Tuner.deliver around engine.deliver),
and what its guard against an overtaken iterator adds while ``num_workers="auto"`` measures.

    python -m benchmarks.tuner_guard [--rounds 15] [--items 20000] [--against FILE]

``engine.deliver`` is replaced by a bare generator, so only the tuner's own layers are
timed: a settled Loader (a fixed setting) through ``Tuner.deliver``, interleaved with the
same through the autotune.py in ``--against`` (e.g. main's: ``git show
main:reader/batch/autotune.py > /tmp/old_autotune.py``); and ``Tuner._guarded`` around a
bare generator against the bare generator (docs/benchmarks.md, "review3").
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

from dlpack_io.reader.batch import autotune
from dlpack_io.reader.batch.options import LoaderOptions


def _fake(engine, batches, k, *args):
    for i in range(k, len(batches)):
        yield i, None, None, None


def _settled(module, n: int) -> float:
    tuner, batches = module.Tuner(LoaderOptions(num_workers=2)), list(range(n))
    t0 = time.perf_counter()
    for _ in tuner.deliver(None, None, batches, 0, 0, None, 0, None):
        pass
    return (time.perf_counter() - t0) / n * 1e9


def _guard(guarded: bool, n: int) -> float:
    tuner = autotune.Tuner(LoaderOptions(num_workers=2))
    items = iter(range(n))
    t0 = time.perf_counter()
    for _ in (tuner._guarded(tuner._newest, items) if guarded else items):
        pass
    return (time.perf_counter() - t0) / n * 1e9


def main() -> None:
    """Print the medians (ns per batch) and the load average."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--items", type=int, default=20000)
    ap.add_argument("--against", default=None, help="another autotune.py to compare with")
    args = ap.parse_args()
    modules = {"this": autotune}
    if args.against:
        spec = importlib.util.spec_from_file_location("autotune_against", args.against)
        modules["against"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules["against"])
    for module in modules.values():
        module.deliver = _fake
    times = {name: [] for name in list(modules) + ["bare", "guarded"]}
    for _ in range(args.rounds):
        for name, module in modules.items():
            times[name].append(_settled(module, args.items))
        times["bare"].append(_guard(False, args.items))
        times["guarded"].append(_guard(True, args.items))
    for name, values in times.items():
        print(f"{name}: {statistics.median(values):.1f} ns per batch (median of {args.rounds})")
    with open("/proc/loadavg") as f:
        print("load", f.read().strip())


if __name__ == "__main__":
    main()
