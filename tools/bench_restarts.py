"""A/B benchmark of ``--restart-markers``: torch DataLoader over the JPEG files vs our Loader
(2 threads) over default records vs over records packed with restart markers.

    python -m dlpack_io.tools.bench_restarts ROOT [--rounds 11] [--images 2000]

Same JPEGs, same work (decode -> random-resized-crop 224 -> flip -> CHW uint8, batch 256,
2 workers), warm page cache; one warm-up round then ``rounds`` timed rounds whose order
rotates; each ratio is the median of the per-round ratios. Writes ROOT/result.json.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path

log = logging.getLogger(__name__)


def _prepare(root: Path, images: int) -> tuple[Path, Path, Path]:
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    src, plain, rst = root / "jpegs", root / "ds_jpeg", root / "ds_jpeg_rst"
    if not src.exists():
        make_image_folder(src, images, num_classes=100, seed=0)
    for dst, restarts in ((plain, False), (rst, True)):
        if not (dst / "manifest.json").exists():
            start = time.perf_counter()
            res = convert(src, dst, mode="jpeg", shard_size="64MB", workers=2, progress=False,
                          overwrite=True, jpeg_restarts=restarts)
            log.info("%s: packed in %.1f s, %s, %d bytes", dst.name,
                     time.perf_counter() - start, res["reencoded"], res["num_bytes"])
    return src, plain, rst


def run_rotated(table: dict, rounds: int) -> dict:
    """Epoch rates per contender: one warm-up round, then rounds in rotating order."""
    from dlpack_io.tools import bench_loader as bl

    names, rates = list(table), {name: [] for name in table}
    for r in range(-1, rounds):
        order = names[r % len(names):] + names[:r % len(names)] if r >= 0 else names
        for name in order:
            make_iter, path = table[name]
            rate = bl.epoch_rate(make_iter, path)
            log.info("round %d %-45s %8.0f img/s", r, name, rate)
            if r >= 0:
                rates[name].append(rate)
    return rates


def main(argv=None) -> None:
    """Command-line entry point."""
    from dlpack_io.reader import Dataset, RandomResizedCrop
    from dlpack_io.tools import bench_loader as bl
    from dlpack_io.tools import bench_loader_peers as peers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="work folder (JPEGs and both data sets are made there)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--images", type=int, default=2000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    root = Path(args.root)
    src, plain, rst = _prepare(root, args.images)
    rrc, load0 = RandomResizedCrop(224), os.getloadavg()[0]
    table = {
        "DataLoader over JPEG files (PIL)": (peers.dataloader(peers.JpegFiles(src), 2), src),
        "Loader, threads, default records": (bl._ours(Dataset(plain), rrc, "thread", 2), plain),
        "Loader, threads, --restart-markers records": (bl._ours(Dataset(rst), rrc, "thread", 2), rst),
    }
    rates = run_rotated(table, args.rounds)
    names = list(table)
    out = {"epochs": {n: {"median": statistics.median(v), "all": [round(x) for x in v]}
                      for n, v in rates.items()},
           "load": [load0, os.getloadavg()[0]]}
    for n, base in ((names[1], names[0]), (names[2], names[0]), (names[2], names[1])):
        per = [a / b for a, b in zip(rates[n], rates[base])]
        out[f"{n} / {base}"] = {"median": statistics.median(per), "all": [round(x, 2) for x in per]}
    print(json.dumps(out, indent=1))
    (root / "result.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
