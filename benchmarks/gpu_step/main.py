"""``python -m benchmarks.gpu_step``: the command (see the package's docstring), the
summary against the resident floor and its markdown report."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import benchmarks.gpu_step as package
from benchmarks.gpu_step.data import prepare_data
from benchmarks.gpu_step.steps import measure

TARGET_FRACTION = 0.05


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (defaults: the ImageNet training case on one GPU)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_step",
                                description=package.__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256, help="images per batch (256)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per contender and round")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps first, each round (8)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of every contender (2)")
    p.add_argument("--workers", type=int, default=min(12, max(1, (os.cpu_count() or 2) - 2)),
                   help="loader worker threads (cores - 2, at most 12)")
    p.add_argument("--prefetch", type=int, default=None, help="batches in flight (= workers)")
    p.add_argument("--width", type=int, default=64, help="network base width (64: ResNet-50)")
    p.add_argument("--size", type=int, default=224, help="crop size (224)")
    p.add_argument("--data", default=None, help="a packed data set to read instead")
    p.add_argument("--work-dir", default="bench-out/gpu-step", help="synthetic data set here")
    p.add_argument("--json", default="bench-out/gpu_step.json", help="report path")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny everything on the CPU (device_transforms=True): checks this "
                        "script's logic where there is no GPU; its timings mean nothing")
    return p.parse_args(argv)


def summarise(raw: dict) -> dict:
    """Medians in ms, and the exposed data time of each loader against ``resident``."""
    out = {}
    floor = statistics.median(raw["resident"]["steps"])
    for name, r in raw.items():
        step = statistics.median(r["steps"])
        out[name] = {"step_ms": 1e3 * step, "wait_ms": 1e3 * statistics.median(r["waits"]),
                     "step_p90_ms": 1e3 * sorted(r["steps"])[-(-9 * len(r["steps"]) // 10) - 1],
                     "exposed_ms": 1e3 * (step - floor), "exposed_fraction": (step - floor) / floor,
                     "steps": len(r["steps"])}
    return out


def report_lines(summary: dict, env: dict, args) -> list[str]:
    """Markdown table and the verdict on issue 14's target."""
    lines = [f"# Exposed data time per step on {env['device']}", "",
             f"torch {env['torch']}, batch {args.batch}, ResNet-50-like (width {args.width}), "
             f"{args.workers} worker threads, prefetch {args.prefetch or args.workers}, "
             f"{args.rounds} rounds x {args.steps} timed steps", "",
             "| contender | step ms (median) | p90 ms | wait in next() ms | exposed ms | "
             "exposed % of step |", "|---|---:|---:|---:|---:|---:|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {s['step_ms']:.1f} | {s['step_p90_ms']:.1f} | "
                     f"{s['wait_ms']:.2f} | {s['exposed_ms']:.2f} | "
                     f"{100 * s['exposed_fraction']:.1f}% |")
    s = summary["staged"]
    ok = s["exposed_fraction"] < TARGET_FRACTION
    lines += ["", f"- staged: exposed {s['exposed_ms']:.2f} ms = "
                  f"{100 * s['exposed_fraction']:.1f}% of the step; target < "
                  f"{100 * TARGET_FRACTION:.0f}%: {'MET' if ok else 'NOT MET'}"]
    return lines


def environment(device) -> dict:
    """Device name and versions for the report."""
    import platform

    import torch

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {"device": name or "cpu", "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main(argv=None) -> int:
    """Run the benchmark; print the table; write the JSON report. Returns the exit status."""
    args = parse_args(argv)
    if args.cpu_smoke:
        args.batch, args.steps, args.warmup, args.rounds = 4, 2, 1, 1
        args.workers, args.width, args.size = 2, 4, 32
    import torch

    if args.cpu_smoke:
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("gpu_step: no CUDA device (torch.cuda.is_available() is False); use --cpu-smoke "
              "to check the script itself", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
        torch.backends.cudnn.benchmark = True
    count = (args.warmup + args.steps) * args.batch
    size = (48, 64) if args.cpu_smoke else (375, 500)
    ds_path = args.data or prepare_data(args, count, size, classes=10 if args.cpu_smoke else 100)
    from dlpack_io.reader import Dataset

    ds = Dataset(ds_path)
    if len(ds) < count:
        print(f"gpu_step: {ds_path} has {len(ds)} samples; {count} are needed for "
              f"{args.warmup} + {args.steps} steps of {args.batch}", file=sys.stderr)
        return 2
    env = environment(device)
    summary = summarise(measure(args, ds, device))
    lines = report_lines(summary, env, args)
    if args.cpu_smoke:
        lines.append("\n(CPU smoke run: timings are meaningless)")
    print("\n".join(lines))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(env, args=vars(args), data=ds_path, summary=summary,
                                    target_fraction=TARGET_FRACTION, cpu_smoke=args.cpu_smoke),
                               indent=2))
    return 0
