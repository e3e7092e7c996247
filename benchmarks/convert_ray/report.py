"""The Ray conversion benchmark's tables for docs/benchmarks.md."""
from __future__ import annotations

from benchmarks.convert_ray.engines import RUNNING


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
