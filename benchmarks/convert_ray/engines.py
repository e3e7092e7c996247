"""The Ray conversion benchmark's contenders and clock: the "ray" family's builders
(tools/bench/families.py), one timed run, the fixed costs of Ray, interleaved rounds."""
from __future__ import annotations

import os
import shutil
import statistics
import time

from dlpack_io.tools.pagecache import warm

from benchmarks.convert_ray.rayhost import HeadNode

RUNNING = "ray-running"  # the family whose head node is started before the clock


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
            only=None, *, self_cpu) -> dict:
    """Every "ray" family (or those in ``only``) ``repeats`` times, interleaved; timings.
    ``self_cpu``: the CPUGroup of this process and all it starts (see main.main)."""
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
                groups = (self_cpu, head.cpu) if f.name == RUNNING else (self_cpu,)
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
