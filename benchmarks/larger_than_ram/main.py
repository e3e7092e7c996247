"""``python -m benchmarks.larger_than_ram``: the command (see the package's docstring)."""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

import benchmarks.larger_than_ram as package
from benchmarks.larger_than_ram.cgroup import cgroup_usable
from benchmarks.larger_than_ram.measure import bench_mode, contenders
from benchmarks.larger_than_ram.report import markdown, write_section


def prepare(root: Path, args) -> dict:
    """Create (once) the JPEG folder and its jpeg- and raw-mode packings."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    src = root / "jpegs"
    if not src.exists():
        make_image_folder(src, args.images, num_classes=100, seed=0, size=args.image_size)
    paths = {}
    for mode in args.modes:
        paths[mode] = root / f"ds_{mode}"
        if not (paths[mode] / "manifest.json").exists():
            convert(src, paths[mode], mode=mode, size=args.raw_size if mode == "raw" else None,
                    shard_size=args.shard_size, workers=2, progress=False, overwrite=True)
    return paths


def _names() -> list:
    from dlpack_io.tools.bench.families import BY_SECTION

    return list(BY_SECTION["ram"])


def _arguments(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.larger_than_ram",
                                description=package.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--root", type=Path, default=Path("bench-out/ram"), help="work folder (data is kept)")
    add("--images", type=int, default=10000, help="JPEGs to synthesise (~110 KB each)")
    add("--image-size", type=lambda s: tuple(int(x) for x in s.split("x")), default=(375, 500),
        help="HxW of the synthetic JPEGs")
    add("--modes", nargs="+", choices=("jpeg", "raw"), default=["jpeg", "raw"])
    add("--raw-size", type=int, default=256, help="side of raw-mode records")
    add("--shard-size", default="64MB", help="dlpack convert --shard-size")
    add("--crop", type=int, default=224, help="output side (RandomResizedCrop / RandomCrop)")
    add("--batch", type=int, default=256)
    add("--workers", type=int, default=2, help="thread workers")
    add("--only", help="comma-separated contenders of the registry's \"ram\" section "
        "(tools/bench/families.py; default: all): " + ", ".join(_names())
        + "; global, the baseline, always runs")
    add("--cache-mb", type=int, default=256, help="page cache allowed to the epoch")
    add("--method", choices=("auto", "cgroup", "fadvise"), default="auto")
    add("--cgroup-root", default="/sys/fs/cgroup/memory", help="cgroup v1 memory hierarchy")
    add("--rounds", type=int, default=3, help="rounds (medians)")
    add("--reference", nargs="*", choices=("cold", "warm"), default=["cold", "warm"],
        help="unlimited reference epochs per shuffle (none: --reference alone)")
    add("--json", type=Path, help="write all results here")
    add("--write", help="markdown file whose section to (re)write")
    add("--render", type=Path, help="only print/--write the report of a saved --json")
    return p.parse_args(argv)


def _method(args) -> str:
    """The page-cache limit to use: --method, "auto" resolved; SystemExit when a cgroup is
    asked for and none can be made."""
    usable = args.method in ("auto", "cgroup") and cgroup_usable(args.cgroup_root)
    if args.method == "auto":
        return "cgroup" if usable else "fadvise"
    if args.method == "cgroup" and not usable:
        raise SystemExit(f"{args.cgroup_root}: cannot create a cgroup v1 memory cgroup here "
                         f"(not root, or not a v1 memory hierarchy); use --method fadvise")
    return args.method


def _context(args, argv, load0: float, started: float) -> dict:
    """Where and when it ran, and the command that reproduces it."""
    return dict(
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        machine=f"{platform.machine()}, {os.cpu_count()} cores, "
                f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB",
        context=f"1-minute load average {load0:.2f} before, {os.getloadavg()[0]:.2f} "
                f"after ({time.time() - started:.0f} s).",
        command="python -m benchmarks.larger_than_ram " +
                " ".join(sys.argv[1:] if argv is None else argv))


def main(argv=None) -> dict:
    """Run the benchmark; print (and optionally write into docs) the results."""
    args = _arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.render:
        return _report(json.loads(args.render.read_text()), args)
    try:
        contenders(args.only)
    except ValueError as exc:  # before any data is made
        raise SystemExit(str(exc)) from None
    method = _method(args)
    paths = prepare(args.root, args)
    load0, started = os.getloadavg()[0], time.time()
    res = {"method": method, "cache_mb": args.cache_mb, "modes": {}, "data": (
        f"{args.images:,} synthetic ImageNet-like JPEGs (`tools/synth.py`, about "
        f"{args.image_size[1]}x{args.image_size[0]}, 100 classes) packed by `dlpack convert` "
        f"with `--shard-size {args.shard_size}` in jpeg mode and in raw mode (`--size "
        f"{args.raw_size}`)")}
    for mode, path in paths.items():
        res["modes"][mode] = bench_mode(mode, path, args, method)
    res.update(_context(args, argv, load0, started))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return _report(res, args)


def _report(res: dict, args) -> dict:
    text = markdown(res)
    print(text)
    if args.write:
        write_section(args.write, text)
    return res
