"""Benchmark the Loader against torch's DataLoader doing the same work, in one run.

    python -m dlpack_io.tools.bench_loader --root bench-out/loader --images 2000 --rounds 5 \\
        --write docs/benchmarks.md

Work (the same for every contender, on the same ImageNet-like JPEGs):
  * jpeg: decode -> random-resized-crop 224 (torchvision box sampling, bilinear
    antialiased resize) -> random h-flip -> CHW uint8 batch of 256;
  * raw: stored 256x256 pixels -> random 224 crop -> random h-flip -> CHW uint8 batch.
One full random-order epoch per measurement, page cache warmed (files re-read, untimed)
right before each; contenders interleaved round by round; medians and ratios reported.
Also measured: single-core memcpy bandwidth vs the device path's CPU share (gathering
whole stored records into the batch buffer), and the time to the first batch on a
100k-sample data set.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path


from dlpack_io.tools import bench_loader_peers as peers
from dlpack_io.tools.pagecache import warm

log = logging.getLogger(__name__)
BATCH = 256


def prepare(root: Path, images: int) -> dict:
    """Create (once) the JPEG folder, both packed data sets, .npy files, a 100k data set."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    paths = {"src": root / "jpegs", "jpeg": root / "ds_jpeg", "raw": root / "ds_raw",
             "npy": root / "npy", "big": root / "ds_100k"}
    if not paths["src"].exists():
        make_image_folder(paths["src"], images, num_classes=100, seed=0)
    for mode, size in (("jpeg", None), ("raw", 256)):
        if not (paths[mode] / "manifest.json").exists():
            convert(paths["src"], paths[mode], mode=mode, size=size, shard_size="64MB",
                    workers=2, progress=False, overwrite=True)
    if not paths["npy"].exists():
        peers.write_npy_files(paths["raw"], paths["npy"])
    if not (paths["big"] / "manifest.json").exists():
        peers.repeat_dataset(paths["raw"], paths["big"], 100_000)
    return paths


def epoch_rate(make_iter, warm_path: Path) -> float:
    """Images per second of one full epoch (after the previous contender's leftovers)."""
    gc.collect()
    time.sleep(0.5)  # let exiting workers and freed memory settle before the clock starts
    warm(warm_path)
    start = time.perf_counter()
    n = 0
    for images, labels in make_iter():
        n += len(labels)
    return n / (time.perf_counter() - start)


def _ours(ds, crop, kind: str, workers: int):
    """One Loader for all rounds (as a training script has), a new epoch each call."""
    import torch

    from dlpack_io.reader import Loader, RandomHorizontalFlip

    loader = Loader(ds, batch_size=BATCH, transforms=[crop, RandomHorizontalFlip()],
                    num_workers=workers, worker_kind=kind, dtype=torch.uint8, drop_last=False)

    def next_epoch():
        loader.set_epoch(loader.epoch + 1)
        return loader
    return next_epoch


def contenders(paths: dict, workers: int) -> tuple[dict, dict]:
    """Two groups of name -> (make_iter, files to warm): the targets (ours with threads vs
    the DataLoaders) and thread vs process workers. Process workers fork the benchmark
    process every epoch, which write-protects its pages (copy-on-write) and makes the next
    contender pay page faults, so they run in their own group."""
    from dlpack_io.reader import Dataset, RandomCrop, RandomResizedCrop

    ds_j, ds_r = Dataset(paths["jpeg"]), Dataset(paths["raw"])
    rrc, rc = RandomResizedCrop(224), RandomCrop(224)
    targets = {
        "jpeg: DataLoader over JPEG files (PIL)":
            (peers.dataloader(peers.JpegFiles(paths["src"]), workers), paths["src"]),
        "jpeg: DataLoader over our shards (Dataset)":
            (peers.dataloader(peers.OurDatasetRRC(paths["jpeg"]), workers), paths["jpeg"]),
        "jpeg: Loader, threads": (_ours(ds_j, rrc, "thread", workers), paths["jpeg"]),
        "raw: DataLoader over .npy files":
            (peers.dataloader(peers.NpyFiles(paths["npy"]), workers), paths["npy"]),
        "raw: Loader, threads": (_ours(ds_r, rc, "thread", workers), paths["raw"]),
    }
    kinds = {f"{mode}: Loader, {label}": (_ours(ds, crop, kind, workers), paths[mode])
             for mode, ds, crop in (("jpeg", ds_j, rrc), ("raw", ds_r, rc))
             for kind, label in (("thread", "threads"), ("process", "processes"))}
    return targets, kinds


def run_rounds(table: dict, rounds: int) -> dict:
    """Median images/s per contender over ``rounds`` interleaved rounds."""
    rates = {name: [] for name in table}
    for r in range(-1, rounds):  # round -1 warms up (first touch of the mmaps, buffers)
        for name, (make_iter, path) in table.items():
            rate = epoch_rate(make_iter, path)
            log.info("round %d %-45s %8.0f img/s", r, name, rate)
            if r >= 0:
                rates[name].append(rate)
    return {name: {"median": statistics.median(v), "all": [round(x) for x in v]}
            for name, v in rates.items()}


_RATIOS = {
    "jpeg Loader / DataLoader over JPEG files (target >= 2.0)":
        ("jpeg: Loader, threads", "jpeg: DataLoader over JPEG files (PIL)"),
    "jpeg Loader / DataLoader over our shards (target >= 1.3)":
        ("jpeg: Loader, threads", "jpeg: DataLoader over our shards (Dataset)"),
    "raw Loader / DataLoader over .npy files (target >= 5.0)":
        ("raw: Loader, threads", "raw: DataLoader over .npy files"),
}


def ratios(res: dict) -> dict:
    """Target ratios: the median over rounds of (ours / peer) within each round, so a
    round slowed by other load on the machine slows both sides of its ratio."""
    out = {}
    for name, (ours, peer) in _RATIOS.items():
        per_round = [a / b for a, b in zip(res[ours]["all"], res[peer]["all"])]
        out[name] = statistics.median(per_round)
    return out


def markdown(res: dict) -> str:
    """The Loader section of docs/benchmarks.md."""
    load = res.get("load_average", ["?", "?"])
    lines = ["## Loader", "", f"Machine: {res['machine']}. Date: {res['date']}.",
             f"Command: `{res['command']}`", "",
             f"The machine is shared: 1-minute load average {load[0]} before, {load[1]} after "
             f"(2 cores); absolute numbers move with it, ratios within a run hold better.", "",
             "Full random-order epochs of 2,000 ImageNet-like JPEGs (~500x375, ~110 KB), batch "
             "256, 2 workers each (DataLoaders with persistent workers, every loader built "
             "once and iterated once per round), warm page cache, contenders interleaved "
             "after one warm-up round; median of the rounds (all rounds in brackets).", "",
             "| contender | images/s (median) | rounds |", "|---|---:|---|"]
    for name, v in res["epochs"].items():
        lines.append(f"| {name} | {v['median']:,.0f} | {v['all']} |")
    lines += ["", "| ratio (median over rounds of the ratio within each round) | measured |",
              "|---|---:|"]
    for name, v in res["ratios"].items():
        lines.append(f"| {name} | {v:.2f} |")
    if "kinds" in res:
        lines += ["", "Worker kind (a separate group of rounds: process workers fork the "
                      "benchmark process each epoch, which would tax the other contenders "
                      "with copy-on-write faults):", "",
                  "| Loader | images/s (median) | rounds |", "|---|---:|---|"]
        for name, v in res["kinds"].items():
            lines.append(f"| {name} | {v['median']:,.0f} | {v['all']} |")
    d = res.get("decode")
    if d:
        lines += ["", f"Single core, per image (same records and boxes, best of 5): PIL full decode {d['pil_full_decode_us']:.0f} us, "
                      f"the DataLoader peer's whole work {d['peer_work_us']:.0f} us; our region decode "
                      f"{d['region_decode_us']:.0f} us, our whole work {d['loader_work_us']:.0f} us "
                      f"(ratio {d['peer_work_us'] / d['loader_work_us']:.2f}). Entropy decoding of every "
                      f"row down to the crop's bottom is the floor (see docs/loader.md)."]
    return "\n".join(lines + _side_lines(res))


def _side_lines(res: dict) -> list:
    """The gather-vs-memcpy and time-to-first-batch lines."""
    g, fb = res["gather"], res["first_batch"]
    return ["", f"Device path, CPU share: one thread gathers whole 256x256x3 records into a "
                  f"reused batch buffer at {g['gather_GBps']:.1f} GB/s ({g['images_per_s']:,.0f} "
                  f"images/s) vs single-core memcpy {g['memcpy_GBps']:.1f} GB/s: "
                  f"**{100 * g['ratio']:.0f}%** (target >= 50%).", "",
              f"Time to first batch on a {fb['num_samples']:,}-sample raw data set: "
              f"**{fb['seconds']:.2f} s** from `Dataset(path)` to the first batch "
              f"({fb['seconds_with_imports']:.2f} s including `import torch`), target < 1 s.", ""]


def write_section(path, text: str) -> None:
    """Replace (or append) the ``## Loader`` section of a markdown file."""
    p = Path(path)
    old = p.read_text() if p.exists() else "# Benchmarks\n"
    start = old.find("## Loader")
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + 1)
        new = old[:start] + text.rstrip("\n") + "\n" + ("" if end < 0 else old[end:])
    p.write_text(new)


def main(argv=None) -> dict:
    """Run the benchmark; print (and optionally write into docs) the results."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="bench-out/loader", help="work folder (data is kept)")
    p.add_argument("--images", type=int, default=2000, help="JPEGs to synthesise")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved timed rounds (median), after one warm-up round")
    p.add_argument("--workers", type=int, default=2, help="workers for every contender")
    p.add_argument("--write", default=None, help="markdown file to (re)write the Loader section of")
    p.add_argument("--json", default=None, help="write the raw results here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    paths = prepare(Path(args.root), args.images)
    load_before = os.getloadavg()[0]
    targets, kinds = contenders(paths, args.workers)
    res = {"epochs": run_rounds(targets, args.rounds), "kinds": run_rounds(kinds, args.rounds)}
    res["ratios"] = ratios(res["epochs"])
    res["gather"] = peers.gather_vs_memcpy(paths["raw"], rounds=args.rounds)
    res["decode"] = peers.decode_breakdown(paths["jpeg"])
    res["first_batch"] = peers.first_batch(paths["big"])
    res["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    res["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}"
    res["date"] = datetime.date.today().isoformat()
    res["command"] = "python -m dlpack_io.tools.bench_loader " + " ".join(
        sys.argv[1:] if argv is None else argv)
    text = markdown(res)
    print(text)
    if args.write:
        write_section(args.write, text)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
