"""Conversion benchmark: our packer against ``tar cf`` and WebDataset's ShardWriter.

    python -m dlpack_io.tools.bench_convert [--images 3000] [--repeats 3] [--out bench-out]

Every contender packs the same generated ImageNet-like folder (about 500x375, ~110 KB
JPEGs) from a warm page cache (files re-read, untimed, right before each timed run, since
this machine evicts pages idle for ~30 s). Contenders run interleaved, round by round;
we report the median of the repeats in images/s and MB/s of input read, and the ratios the
issue sets as targets. Our shards are fsynced before rename; tar and WebDataset do not
fsync, which only favours them.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from dlpack_io.tools.pagecache import warm
from dlpack_io.tools.synth import folder_bytes, make_image_folder


def pack_ours(src, dst, **options):
    """Our packer into ``dst`` (overwriting), 256 MB shards, no progress bar."""
    from dlpack_io.packer import convert

    convert(src, dst, overwrite=True, progress=False, shard_size="256MB", **options)


def tar_folder(src, dst):
    """``tar cf`` of ``src`` into ``dst/all.tar``."""
    os.makedirs(dst, exist_ok=True)
    subprocess.run(["tar", "cf", os.path.join(dst, "all.tar"), "-C", str(src), "."], check=True)


def webdataset_shards(src, dst):
    """WebDataset's ShardWriter over the JPEGs of ``src`` (no decoding), 256 MB shards."""
    import webdataset as wds

    from dlpack_io.packer.scan import scan_image_folder

    inputs = scan_image_folder(src)
    os.makedirs(dst, exist_ok=True)
    with wds.ShardWriter(os.path.join(dst, "shard-%06d.tar"), maxsize=256 * 10**6, verbose=0) as sink:
        for i, (rel, label) in enumerate(zip(inputs.paths, inputs.labels)):
            with open(os.path.join(inputs.root, rel), "rb") as f:
                sink.write({"__key__": f"{i:08d}", "jpg": f.read(), "cls": label})


def contenders() -> dict:
    """name -> callable(src, dst) for every configuration measured."""
    runs = {"tar cf": tar_folder, "webdataset ShardWriter (no validation)": webdataset_shards}
    for fmt_ in ("record", "lmdb"):
        for workers in (1, 2):
            runs[f"ours {fmt_} jpeg, validate, {workers}w"] = (
                lambda s, d, f=fmt_, w=workers: pack_ours(s, d, format=f, mode="jpeg", workers=w))
            runs[f"ours {fmt_} raw 256, {workers}w"] = (
                lambda s, d, f=fmt_, w=workers: pack_ours(s, d, format=f, mode="raw", size=256, workers=w))
    runs["ours record jpeg, no validation, 2w"] = (
        lambda s, d: pack_ours(s, d, format="record", mode="jpeg", workers=2, validate=False))
    return runs


def measure(src, out, repeats: int) -> dict:
    """Run every contender ``repeats`` times, interleaved; return seconds per run."""
    runs = contenders()
    times = {name: [] for name in runs}
    for r in range(repeats):
        for name, fn in runs.items():
            dst = os.path.join(out, "dst")
            shutil.rmtree(dst, ignore_errors=True)
            warm(src)
            start = time.perf_counter()
            fn(src, dst)
            times[name].append(time.perf_counter() - start)
            shutil.rmtree(dst, ignore_errors=True)
        print(f"round {r + 1}/{repeats} done", flush=True)
    return times


def report(times: dict, num_images: int, nbytes: int) -> dict:
    """Medians, rates and the target ratios."""
    rows = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        rows[name] = {"seconds": ts, "median_s": med, "images_per_s": num_images / med,
                      "mb_per_s": nbytes / 1e6 / med}
    ips = {n: r["images_per_s"] for n, r in rows.items()}
    wds = ips["webdataset ShardWriter (no validation)"]
    targets = {
        "record passthrough+validate (2w) / webdataset": ips["ours record jpeg, validate, 2w"] / wds,
        "lmdb passthrough+validate (2w) / webdataset": ips["ours lmdb jpeg, validate, 2w"] / wds,
        "record raw 2w / 1w": ips["ours record raw 256, 2w"] / ips["ours record raw 256, 1w"],
        "lmdb raw 2w / 1w": ips["ours lmdb raw 256, 2w"] / ips["ours lmdb raw 256, 1w"],
    }
    return {"rows": rows, "targets": targets}


def markdown(result: dict) -> str:
    """The results as a markdown table plus the target ratios."""
    lines = ["| contender | images/s | MB/s read | median s |", "|---|---:|---:|---:|"]
    for name, r in result["rows"].items():
        lines.append(f"| {name} | {r['images_per_s']:,.0f} | {r['mb_per_s']:,.1f} | {r['median_s']:.2f} |")
    lines += ["", "| target ratio | measured |", "|---|---:|"]
    lines += [f"| {k} | {v:.2f}x |" for k, v in result["targets"].items()]
    return "\n".join(lines)


def main(argv=None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench-out")
    args = parser.parse_args(argv)
    src = Path(args.out) / f"jpegs-{args.images}"
    if not src.exists():
        print(f"generating {args.images} ImageNet-like JPEGs in {src} ...", flush=True)
        make_image_folder(src, args.images, 100, seed=0)
    nbytes = folder_bytes(src)
    times = measure(src, args.out, args.repeats)
    result = report(times, args.images, nbytes)
    result["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                         "python": platform.python_version(),
                         "date": time.strftime("%Y-%m-%d"), "images": args.images,
                         "mean_kb": nbytes / args.images / 1e3}
    Path(args.out, "bench_convert.json").write_text(json.dumps(result, indent=2))
    print(markdown(result))


if __name__ == "__main__":
    main()
