"""``python -m benchmarks.convert_ray``: the command (see the package's docstring)."""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from dlpack_io.tools.synth import folder_bytes, make_image_folder

import benchmarks.convert_ray as package
from benchmarks.convert_ray.driver import driver_footprint, larger_run, slopes
from benchmarks.convert_ray.engines import fixed_costs, measure, summarize
from benchmarks.convert_ray.rayhost import CPUGroup
from benchmarks.convert_ray.report import markdown


def main(argv=None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.convert_ray",
                                     description=package.__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shard-size", default="256MB")
    parser.add_argument("--out", default="bench-out")
    parser.add_argument("--larger", type=int, default=10, metavar="K",
                        help="also time a job listing every image K times (0: skip)")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Before ray is imported (it reads this then): the private clusters skip the token file
    # in ~/.ray that Ray 2.60 writes by default; the head node has no token either.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    src = Path(args.out) / f"jpegs-{args.images}"
    if not src.exists():
        print(f"generating {args.images} ImageNet-like JPEGs in {src} ...", flush=True)
        make_image_folder(src, args.images, 100, seed=0)
    # this process and all it starts (workers, private Ray) count their CPU in one group
    self_cpu = CPUGroup("dlbench")
    self_cpu.add(os.getpid())
    try:
        run(args, src, self_cpu)
    finally:
        self_cpu.remove(move_self=True)


def run(args, src, self_cpu) -> None:
    """Every measurement, then the JSON and the tables."""
    fixed = fixed_costs(args.cpus)
    rows = summarize(measure(src, args.out, args.cpus, args.repeats, args.shard_size,
                             self_cpu=self_cpu), args.images)
    driver = slopes(src, args.out, args.cpus, args.shard_size, args.images, rows,
                    self_cpu=self_cpu)
    driver.update(driver_footprint(src))
    larger = {}
    if args.larger:
        larger[f"{args.images * args.larger:,} entries ({args.larger}x each image)"] = larger_run(
            src, args.out, args.cpus, args.shard_size, args.larger, args.images,
            self_cpu=self_cpu)
    result = {"rows": rows, "fixed": fixed, "driver": driver, "larger": larger, "machine": {
        "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"), "images": args.images, "ray_cpus": args.cpus,
        "shard_size": args.shard_size, "mean_kb": folder_bytes(src) / args.images / 1e3,
        "load_avg": os.getloadavg()}}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "bench_convert_ray.json").write_text(json.dumps(result, indent=2))
    print(markdown(result))
