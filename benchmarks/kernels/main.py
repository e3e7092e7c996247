"""``python -m benchmarks.kernels``: the command (see the package's docstring), the
markdown table against copy bandwidth, the verdicts on the targets and the JSON report."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import benchmarks.kernels as package
from benchmarks.kernels.cases import cases, end_to_end, loader_case, time_call, verify

TARGETS = {"crop_copy_fraction": 0.70, "crop_vs_eager": 5.0, "resize_copy_fraction": 0.50}


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (sizes default to the ImageNet training case)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.kernels",
                                description=package.__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256, help="images per batch (256)")
    p.add_argument("--in-size", type=int, default=256, help="raw case: image side (256)")
    p.add_argument("--src-h", default="333,500", help="JPEG case: photo heights lo,hi")
    p.add_argument("--src-w", default="375,500", help="JPEG case: photo widths lo,hi")
    p.add_argument("--out-size", type=int, default=224, help="output side (224)")
    p.add_argument("--dtypes", default="uint8,float16,float32", help="output dtypes")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls first (10)")
    p.add_argument("--repeats", type=int, default=50, help="timed calls; median (50)")
    p.add_argument("--copy-mib", type=int, default=1024, help="device copy size (1024)")
    p.add_argument("--skip-eager", action="store_true", help="skip torch eager baselines")
    p.add_argument("--json", default="bench-out/kernels.json", help="report path")
    p.add_argument("--seed", type=int, default=0, help="seed of images, boxes, jitter (0)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="every case tiny on CPU under TRITON_INTERPRET=1: checks the script's "
                        "logic where there is no GPU; its timings mean nothing")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- report

def run_bench(args, device, jpeg) -> list[dict]:
    """Time every case; return one row per case."""
    rows = []
    for op, dtype, variant, fn, nbytes in cases(args, device, jpeg):
        cold, loop = time_call(fn, device, args.warmup, args.repeats)
        rows.append({"op": op, "dtype": dtype, "variant": variant, "bytes": nbytes,
                     "us": cold * 1e6, "loop_us": loop * 1e6, "GBps": nbytes / cold / 1e9})
        print(f"  {op:18s} {dtype:8s} {variant:34s} {cold * 1e6:10.1f} us", file=sys.stderr)
    return rows + end_to_end(args, device, jpeg)


def summarise(rows: list[dict]) -> list[str]:
    """Add copy fractions and eager speedups to rows; return markdown lines."""
    copy = next(r["GBps"] for r in rows if r["op"] == "copy")
    lines = ["| op | dtype | variant | us (cold L2) | us (loop) | GB/s | % of D2D copy | "
             "vs best eager |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        eager = [e["us"] for e in rows if e["op"] == r["op"] and e["dtype"] == r["dtype"]
                 and e["variant"].startswith("eager")]
        r["copy_fraction"] = r["GBps"] / copy
        r["vs_eager"] = min(eager) / r["us"] if eager and r["variant"].startswith("triton") else None
        speed = f"{r['vs_eager']:.1f}x" if r["vs_eager"] else ""
        lines.append(f"| {r['op']} | {r['dtype']} | {r['variant']} | {r['us']:.1f} | "
                     f"{r['loop_us']:.1f} | {r['GBps']:.1f} | {100 * r['copy_fraction']:.0f}% | "
                     f"{speed} |")
    return lines


def verdicts(rows: list[dict]) -> list[str]:
    """One line per target: met or not, with the measured number."""
    out = []
    for r in rows:
        if r["variant"] not in ("triton", "triton antialias") or r["op"] == "end_to_end":
            continue
        if r["op"] == "crop_flip_permute":
            ok = r["copy_fraction"] >= TARGETS["crop_copy_fraction"] and (
                r["vs_eager"] is None or r["vs_eager"] >= TARGETS["crop_vs_eager"])
            want = ">= 70% of copy and >= 5x eager"
        else:
            ok, want = r["copy_fraction"] >= TARGETS["resize_copy_fraction"], ">= 50% of copy"
        out.append(f"- {r['op']} {r['dtype']} {r['variant']}: {100 * r['copy_fraction']:.0f}% "
                   f"of copy, {r['GBps']:.0f} GB/s; target {want}: {'MET' if ok else 'NOT MET'}")
    for r in rows:
        if r["op"] == "end_to_end":
            out.append(f"- {r['variant']}: {r['loop_us'] / 1e3:.3f} ms per batch, "
                       f"{r['images_per_s']:.0f} images/s")
    return out


def environment(device) -> dict:
    """Device name and library versions for the JSON report."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed (torch reference path)"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {"device": name or "cpu", "torch": torch.__version__, "triton": triton_version,
            "cuda": torch.version.cuda, "python": platform.python_version(),
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def main(argv=None) -> int:
    """Run the benchmark; print a markdown table; write JSON. Returns the exit status."""
    args = parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
        args.batch, args.in_size, args.out_size, args.src_h, args.src_w = 2, 20, 12, "14,30", "16,30"
        args.warmup, args.repeats, args.copy_mib = 1, 2, 1
    import torch
    if args.cpu_smoke:
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("bench_kernels: no CUDA device found (torch.cuda.is_available() is False); "
              "this benchmark needs an NVIDIA GPU. Use --cpu-smoke to check the script "
              "itself on CPU.", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
    env, jpeg = environment(device), loader_case(args, device)
    problems = verify(args, device, jpeg)
    print("correctness vs torch reference: " + ("OK" if not problems else "MISMATCH"),
          *problems, sep="\n  ", file=sys.stderr)
    rows = run_bench(args, device, jpeg)
    lines = [f"# dlpack kernels on {env['device']}", "",
             f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}; batch "
             f"{args.batch}; raw: {args.in_size}^2 -> {args.out_size}^2 crops; JPEG loader: "
             f"ragged regions, {jpeg['data_bytes'] / 2**20:.1f} MiB per slot, boxes "
             f"{jpeg['box_bytes'] / 2**20:.1f} MiB -> {args.out_size}^2", ""]
    lines += summarise(rows) + [""] + verdicts(rows) + [
        "- kernel outputs vs torch reference: " + ("OK" if not problems else
                                                   "MISMATCH: " + "; ".join(problems))]
    if args.cpu_smoke:
        lines.append("\n(CPU smoke run under the Triton interpreter: timings are meaningless)")
    print("\n".join(lines))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    report = dict(env, args=vars(args), targets=TARGETS, rows=rows, verdicts=verdicts(rows),
                  correctness_problems=problems, cpu_smoke=args.cpu_smoke,
                  jpeg_case={k: jpeg[k] for k in ("n", "box_bytes", "data_bytes")})
    path.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {path}", file=sys.stderr)
    return 1 if problems else 0

