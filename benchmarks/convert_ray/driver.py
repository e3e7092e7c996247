"""What start-up costs hide in the Ray conversion benchmark: marginal rates between a small
and the full job, the driver's CPU per image and per shard, its footprint per input, and
a larger job listing every image several times."""
from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

from dlpack_io.tools.synth import folder_bytes

from benchmarks.convert_ray.engines import RUNNING, measure, summarize


def _subset_list(src, count: int, path: Path) -> Path:
    """A --list file naming the first ``count`` images of ``src`` (same files, no copy)."""
    from dlpack_io.packer.scan import scan_image_folder

    inputs = scan_image_folder(src)
    rows = [f"{p},{inputs.classes[label]}" for p, label in
            list(zip(inputs.paths, inputs.labels))[:count]]
    path.write_text("\n".join(rows) + "\n")
    return path


def slopes(src, out, cpus: int, shard_size: str, images: int, rows: dict, *, self_cpu) -> dict:
    """What start-up costs hide: the marginal rate (images/s between a run of a tenth of the
    images and the full runs) of local and Ray, and the driver's CPU seconds (this process,
    Ray's threads in it included) per image and, against a run with 32x more shards, per shard."""
    from dlpack_io.packer.options import parse_size

    running = RUNNING
    small = max(images // 10, 100)
    subset = _subset_list(src, small, Path(out) / "subset.csv")
    few = summarize(measure(src, out, cpus, 3, shard_size, subset=subset,
                            only=("local", running), self_cpu=self_cpu), small)
    marginal = {name: (images - small) / (rows[name]["wall_s"] - few[name]["wall_s"])
                for name in few}
    per_image = (rows[running]["cpu_s"] - few[running]["cpu_s"]) / (images - small)
    size = parse_size(shard_size)
    many_size = max(size // 32, 2**20)
    many = measure(src, out, cpus, 3, str(many_size), only=(running,), self_cpu=self_cpu)
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
    from dlpack_io.packer.options import PackOptions
    from dlpack_io.packer.packing import packing_order
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


def larger_run(src, out, cpus: int, shard_size: str, times: int, images: int, *,
               self_cpu) -> dict:
    """Local and Ray on a list naming every image ``times`` times (a larger job without
    more files: each entry is read and validated again), 2 rounds interleaved."""
    from dlpack_io.packer.scan import scan_image_folder

    inputs = scan_image_folder(src)
    rows = [f"{p},{inputs.classes[label]}" for p, label in zip(inputs.paths, inputs.labels)]
    listed = Path(out) / f"repeat{times}.csv"
    listed.write_text("\n".join(rows * times) + "\n")
    got = summarize(measure(src, out, cpus, 2, shard_size, subset=listed,
                            only=("local", RUNNING), self_cpu=self_cpu), images * times)
    ray = got[RUNNING]
    return {"images": images * times, "local": got["local"], "ray": ray,
            "ray_vs_local": ray["vs_local"], "cpu_vs_local": ray["cpu_vs_local"]}
