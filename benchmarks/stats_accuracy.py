"""Are ``loader.stats()``'s stall figures right? Compared with the loop's own measurement.

    python -m benchmarks.stats_accuracy [--root /tmp/stats_accuracy] [--rounds 3]

Packs 240 small synthetic JPEGs (96x128) once under ``--root``, then for each setting (0, 1,
2 threads; 1, 2 processes) and training step (none, a 20 ms sleep) runs a Loader for two
epochs of 15 batches of 16 (RandomResizedCrop 64 + flip), the loop timing itself around
every ``next()`` (the StopIteration call included) and counting its images. Prints, per
row, the loop's own wait_fraction, how far ``loader.stats().wait_fraction`` is from it
(median and worst epoch) and the ratio of the two images/s figures (docs/benchmarks.md,
"loader.stats() and dlpack doctor reviewed as a user").
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from dlpack_io.reader import Workers

SETTINGS = (("thread", 0), ("thread", 1), ("thread", 2), ("process", 1), ("process", 2))


def prepare(root: Path) -> str:
    """The packed data set under ``root`` (made once)."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    dst = root / "jpeg"
    if not (dst / "manifest.json").exists():
        make_image_folder(root / "src", 240, 4, seed=3, size=(96, 128))
        convert(root / "src", dst, shard_size="200KB", workers=1, progress=False,
                overwrite=True)
    return str(dst)


def own_epoch(loader, step: float) -> tuple[float, float]:
    """One epoch timed by the loop itself: (its wait_fraction, its images/s)."""
    inside = outside = 0.0
    images, it, start = 0, iter(loader), time.perf_counter()
    while True:
        t0 = time.perf_counter()
        try:
            x, _ = next(it)
        except StopIteration:
            inside += time.perf_counter() - t0
            break
        t1 = time.perf_counter()
        inside, images = inside + t1 - t0, images + len(x)
        if step:
            time.sleep(step)
        outside += time.perf_counter() - t1
    return inside / (inside + outside), images / (time.perf_counter() - start)


def measure(path: str, rounds: int) -> dict:
    """{(kind, workers, step): [(|loader - own| wait_fraction, images/s ratio, own)]}."""
    from dlpack_io.reader import Dataset, Loader, RandomHorizontalFlip, RandomResizedCrop

    rows: dict = {}
    for _ in range(rounds):
        for kind, workers in SETTINGS:
            for step in (0.0, 0.02):
                loader = Loader(Dataset(path), batch_size=16, num_workers=workers,
                                workers=Workers(kind=kind), seed=1,
                                transforms=[RandomResizedCrop(64), RandomHorizontalFlip()])
                for _ in range(2):
                    wf, rate = own_epoch(loader, step)
                    s = loader.stats()
                    rows.setdefault((kind, workers, step), []).append(
                        (abs(s.wait_fraction - wf), s.images_per_s / rate, wf))
                loader.close()
    return rows


def main(argv=None) -> int:
    """Run and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=Path("/tmp/stats_accuracy"))
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    rows = measure(prepare(a.root), a.rounds)
    print("| workers | step | own wait_fraction (median) | abs(loader - own): median, max "
          "| loader images/s / own (median) |\n|---|---|---|---|---|")
    for (kind, workers, step), v in rows.items():
        gaps = [g for g, _, _ in v]
        print(f"| {workers} {kind} | {1000 * step:.0f} ms | "
              f"{statistics.median(w for _, _, w in v):.3f} | {statistics.median(gaps):.4f}, "
              f"{max(gaps):.4f} | {statistics.median(r for _, r, _ in v):.3f} |")
    with open("/proc/loadavg") as f:
        print("load average:", f.read().strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
