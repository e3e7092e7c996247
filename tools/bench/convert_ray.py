"""Conversion benchmark: ``--engine ray`` against the local engine on the same CPUs.

    unshare --net sh -c 'ip link set lo up && python -m dlpack_io.tools.bench.convert_ray'
        [--images 3000] [--cpus 2] [--repeats 5] [--shard-size 256MB] [--out bench-out]

(``unshare --net``, as root, keeps every Ray process on loopback; without it Ray listens on
and talks to the machine's network address.) Contenders (the registry's "ray" section, families.py), interleaved round by round from a
warm page cache (files re-read, untimed, before each run), medians of the repeats:

* ``local``: ``convert(..., workers=CPUS)``, the default engine.
* ``ray, cluster running``: a one-node cluster of CPUS CPUs was started before the clock
  (``ray start --head --num-cpus CPUS``); timed: connect, convert, disconnect.
* ``ray, private cluster``: no address, so ``convert`` starts Ray itself (``ray.init``
  with CPUS CPUs) and stops it: what ``dlpack convert --engine ray`` costs on one machine.

Besides wall time it records ``pack_s`` (the conversion's own ``seconds``: scan, connect
and manifest excluded), the CPU seconds of every process doing the work (driver, the local
engine's workers, the Ray node's raylet, GCS and workers; the private cluster is not
sampled), the fixed costs (importing ray, connecting, starting and stopping a cluster),
the marginal rates and the driver's costs per image and per shard (slopes against smaller
runs), and a larger job (``--larger K``: every image listed K times) where the start-up
weighs less. On a machine shared with other jobs the engine with more processes gets more
of the CPU, so compare the CPU columns too: with nothing else running, both engines keep
every core busy and images/s goes as 1 / CPU seconds.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

from dlpack_io.tools.bench.rayhost import CPUGroup, HeadNode
from dlpack_io.tools.pagecache import warm
from dlpack_io.tools.synth import folder_bytes, make_image_folder

RUNNING = "ray-running"  # the family whose head node runs before the clock
RUNNING = "ray-running"  # the family whose head node is started before the clock
SELF_CPU = None  # main(): a CPUGroup of this process and all it starts (workers, private Ray)


def _convert(src, dst, list_file=None, **options) -> dict:
    from dlpack_io.packer import convert

    return convert(src, dst, overwrite=True, progress=False, list_file=list_file, **options)


def local_engine(src, dst, head, **options) -> dict:
    """The default engine: ``convert(..., workers=CPUS)``."""
    return _convert(src, dst, **options)


def ray_engine(src, dst, head, *, running: bool, **options) -> dict:
    """``--engine ray`` on the running head node, or (not ``running``) on a private cluster
    that convert starts and stops itself."""
    address = {"ray_address": head.address} if running else {}
    return _convert(src, dst, engine="ray", **address, **options)


def timed(fn, groups=()) -> dict:
    """Run ``fn()``; wall and this process's CPU seconds, plus what it returned, and
    ``total_cpu_s``: the CPU of every process in ``groups`` (the benchmark process with
    whatever it starts, and the Ray node when the run uses it), None without cgroups."""
    before = [g.usage() for g in groups]
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    out = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
           "pack_s": result.get("seconds") if isinstance(result, dict) else None}
    after = [g.usage() for g in groups]
    out["total_cpu_s"] = (sum(a - b for a, b in zip(after, before))
                          if groups and None not in before + after else None)
    return out


def fixed_costs(cpus: int) -> dict:
    """Seconds to import ray, start a head node, connect/disconnect, start a private one."""
    out = timed(lambda: __import__("ray"))
    import ray

    start = time.perf_counter()
    head = HeadNode(cpus)
    started = time.perf_counter() - start
    connect = timed(lambda: ray.init(address=head.address, log_to_driver=False,
                                     logging_level="WARNING"))
    shutdown = timed(ray.shutdown)
    head.stop()
    private = timed(lambda: ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                                     logging_level="WARNING"))
    private_down = timed(ray.shutdown)
    return {"import_ray_s": out["wall_s"], "ray_start_head_s": started,
            "connect_s": connect["wall_s"], "disconnect_s": shutdown["wall_s"],
            "private_init_s": private["wall_s"], "private_shutdown_s": private_down["wall_s"]}


def measure(src, out, cpus: int, repeats: int, shard_size: str, subset=None,
            only=None) -> dict:
    """Every "ray" family (or those in ``only``) ``repeats`` times, interleaved; timings."""
    from dlpack_io.tools.bench.families import build, select

    head = HeadNode(cpus)
    opts = dict(shard_size=shard_size, workers=cpus, list_file=subset)
    runs = select("ray", only)
    times = {f.name: [] for f in runs}
    try:
        for r in range(repeats):
            for f in runs:
                dst = os.path.join(out, "dst")
                shutil.rmtree(dst, ignore_errors=True)
                warm(src)
                groups = (SELF_CPU, head.cpu) if f.name == RUNNING else (SELF_CPU,)
                times[f.name].append(timed(lambda: build(f, src, dst, head, **opts), groups))
                shutil.rmtree(dst, ignore_errors=True)
            print(f"round {r + 1}/{repeats} done", flush=True)
    finally:
        head.stop()
    return times


def summarize(times: dict, images: int) -> dict:
    """Medians and rates per contender, and each Ray contender's ratio to local."""
    rows = {}
    for name, runs in times.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "cpu_s", "pack_s")}
        cpus = [r["total_cpu_s"] for r in runs]
        med["total_cpu_s"] = None if None in cpus else statistics.median(cpus)
        rows[name] = dict(med, runs=runs, images_per_s=images / med["wall_s"],
                          pack_images_per_s=images / med["pack_s"])
    local = rows["local"]
    for name, row in rows.items():
        row["vs_local"] = row["images_per_s"] / local["images_per_s"]
        row["pack_vs_local"] = row["pack_images_per_s"] / local["pack_images_per_s"]
        # On a machine with nothing else running both engines keep every core busy, so
        # images/s there goes as 1 / CPU seconds per image (private cluster: not sampled).
        row["cpu_vs_local"] = (local["total_cpu_s"] / row["total_cpu_s"]
                               if row["total_cpu_s"] and local["total_cpu_s"] else None)
    return rows


def _subset_list(src, count: int, path: Path) -> Path:
    """A --list file naming the first ``count`` images of ``src`` (same files, no copy)."""
    from dlpack_io.packer.scan import scan_image_folder

    inputs = scan_image_folder(src)
    rows = [f"{p},{inputs.classes[label]}" for p, label in
            list(zip(inputs.paths, inputs.labels))[:count]]
    path.write_text("\n".join(rows) + "\n")
    return path


def markdown(result: dict) -> str:
    """Tables for docs/benchmarks.md."""
    from dlpack_io.tools.bench.families import BY_SECTION

    lines = ["| contender | images/s (wall) | vs local | pack-only images/s | vs local | "
             "CPU s, all processes | vs local (CPU) | median wall s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in result["rows"].items():
        cpu = (f"{r['total_cpu_s']:.2f} | {r['cpu_vs_local']:.2f}x" if r["cpu_vs_local"]
               else "n/a | n/a")
        lines.append(f"| {BY_SECTION['ray'][name].label} | {r['images_per_s']:,.0f} | {r['vs_local']:.2f}x | "
                     f"{r['pack_images_per_s']:,.0f} | {r['pack_vs_local']:.2f}x | {cpu} | "
                     f"{r['wall_s']:.2f} |")
    for k, big in result.get("larger", {}).items():
        lines += ["", f"{k}: local {big['local']['images_per_s']:,.0f} images/s, Ray (cluster "
                      f"running) {big['ray']['images_per_s']:,.0f} images/s = "
                      f"{big['ray_vs_local']:.2f}x wall, "
                      f"{big['cpu_vs_local'] or float('nan'):.2f}x by CPU."]
    lines += ["", "| fixed cost | seconds |", "|---|---:|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in result["fixed"].items()]
    d = result["driver"]
    m = d["marginal_images_per_s"]
    lines += ["", f"Marginal rate, start-up excluded (slope {d['small']} -> {d['images']} images): "
                  f"local {m['local']:,.0f} images/s, Ray (cluster running) "
                  f"{m[RUNNING]:,.0f} images/s = {d['marginal_ray_vs_local']:.2f}x.",
              f"Driver CPU: {d['driver_per_image_us']:.0f} us per image, "
              f"{d['driver_per_shard_ms']:.1f} ms per shard, {d['driver_fixed_cpu_s']:.2f} s per run; "
              f"before any task: scan {d['scan_us']:.1f} us + stat {d['stat_us']:.1f} us per input "
              f"(warm metadata cache), {d['bytes_per_input']:.0f} bytes held per input."]
    return "\n".join(lines)


def slopes(src, out, cpus: int, shard_size: str, images: int, rows: dict) -> dict:
    """What start-up costs hide: the marginal rate (images/s between a run of a tenth of the
    images and the full runs) of local and Ray, and the driver's CPU seconds (this process,
    Ray's threads in it included) per image and, against a run with 32x more shards, per shard."""
    from dlpack_io.packer.options import parse_size

    running = RUNNING
    small = max(images // 10, 100)
    subset = _subset_list(src, small, Path(out) / "subset.csv")
    few = summarize(measure(src, out, cpus, 3, shard_size, subset=subset,
                            only=("local", running)), small)
    marginal = {name: (images - small) / (rows[name]["wall_s"] - few[name]["wall_s"])
                for name in few}
    per_image = (rows[running]["cpu_s"] - few[running]["cpu_s"]) / (images - small)
    size = parse_size(shard_size)
    many_size = max(size // 32, 2**20)
    many = measure(src, out, cpus, 3, str(many_size), only=(running,))
    many_cpu = statistics.median(r["cpu_s"] for r in many[running])
    nbytes = folder_bytes(src)
    extra_shards = math.ceil(nbytes / many_size) - math.ceil(nbytes / size)
    return {"small": small, "images": images,
            "marginal_images_per_s": marginal,
            "marginal_ray_vs_local": marginal[running] / marginal["local"],
            "small_wall_s": {name: few[name]["wall_s"] for name in few},
            "driver_per_image_us": per_image * 1e6,
            "driver_per_shard_ms": (many_cpu - rows[running]["cpu_s"]) / extra_shards * 1e3,
            "driver_fixed_cpu_s": few[running]["cpu_s"] - per_image * small}


def driver_footprint(src) -> dict:
    """What the driver does alone before any task runs, per input: scanning SRC, stat'ing
    every file (time, warm metadata cache), and the memory it holds for the inputs for the
    whole run (paths, labels, stats, packing order; the Ray engine makes task items per
    segment)."""
    from dlpack_io.packer.conversion import packing_order
    from dlpack_io.packer.options import PackOptions
    from dlpack_io.packer.scan import scan_image_folder, stat_inputs

    scan_image_folder(src)  # warm the dentry cache: a shared file system is slower still
    start = time.perf_counter()
    inputs = scan_image_folder(src)
    scanned = time.perf_counter()
    stats = stat_inputs(inputs)
    done = time.perf_counter()
    order = packing_order(len(inputs.paths), PackOptions())
    n = len(order)
    held = (order.nbytes + sum(map(sys.getsizeof, (inputs.paths, inputs.labels, stats)))
            + sum(map(sys.getsizeof, inputs.paths))
            + sum(sys.getsizeof(label) for label in inputs.labels if label > 256)
            + sum(sys.getsizeof(st) + sys.getsizeof(st[0]) + sys.getsizeof(st[1]) for st in stats))
    return {"inputs": n, "scan_us": (scanned - start) / n * 1e6,
            "stat_us": (done - scanned) / n * 1e6, "bytes_per_input": held / n}


def larger_run(src, out, cpus: int, shard_size: str, times: int, images: int) -> dict:
    """Local and Ray on a list naming every image ``times`` times (a larger job without
    more files: each entry is read and validated again), 2 rounds interleaved."""
    from dlpack_io.packer.scan import scan_image_folder

    inputs = scan_image_folder(src)
    rows = [f"{p},{inputs.classes[label]}" for p, label in zip(inputs.paths, inputs.labels)]
    listed = Path(out) / f"repeat{times}.csv"
    listed.write_text("\n".join(rows * times) + "\n")
    got = summarize(measure(src, out, cpus, 2, shard_size, subset=listed,
                            only=("local", RUNNING)), images * times)
    ray = got[RUNNING]
    return {"images": images * times, "local": got["local"], "ray": ray,
            "ray_vs_local": ray["vs_local"], "cpu_vs_local": ray["cpu_vs_local"]}


def main(argv=None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    global SELF_CPU
    SELF_CPU = CPUGroup("dlbench")
    SELF_CPU.add(os.getpid())
    try:
        run(args, src)
    finally:
        SELF_CPU.remove(move_self=True)


def run(args, src) -> None:
    """Every measurement, then the JSON and the tables."""
    fixed = fixed_costs(args.cpus)
    rows = summarize(measure(src, args.out, args.cpus, args.repeats, args.shard_size), args.images)
    driver = slopes(src, args.out, args.cpus, args.shard_size, args.images, rows)
    driver.update(driver_footprint(src))
    larger = {}
    if args.larger:
        larger[f"{args.images * args.larger:,} entries ({args.larger}x each image)"] = larger_run(
            src, args.out, args.cpus, args.shard_size, args.larger, args.images)
    result = {"rows": rows, "fixed": fixed, "driver": driver, "larger": larger, "machine": {
        "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"), "images": args.images, "ray_cpus": args.cpus,
        "shard_size": args.shard_size, "mean_kb": folder_bytes(src) / args.images / 1e3,
        "load_avg": os.getloadavg()}}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "bench_convert_ray.json").write_text(json.dumps(result, indent=2))
    print(markdown(result))


if __name__ == "__main__":
    main()
