"""Benchmark the fused Triton kernels against copy bandwidth and torch eager on a GPU.

    python -m dlpack_io.tools.bench_kernels               # GPU: table + bench-out/kernels.json
    python -m dlpack_io.tools.bench_kernels --cpu-smoke   # tiny, Triton interpreter, no GPU

GPU timings use CUDA events around each call, the L2 cache flushed before each (the
median of ``--repeats`` after ``--warmup`` calls); the "loop" column is back-to-back calls
(includes Python launch overhead). Bandwidth = (bytes read + bytes written) / time:
read = the crop boxes' pixels, written = the NCHW output; copy = 2x the tensor size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TARGETS = {"crop_copy_fraction": 0.70, "crop_vs_eager": 5.0, "resize_copy_fraction": 0.50,
           "dali_crop_mirror_normalize_GBps": 2600.0}


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (sizes default to the ImageNet training case)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256, help="images per batch (default 256)")
    p.add_argument("--in-size", type=int, default=256, help="input height = width (256)")
    p.add_argument("--out-size", type=int, default=224, help="crop / output size (224)")
    p.add_argument("--dtypes", default="uint8,float16,float32", help="comma-separated output dtypes (uint8,float16,float32)")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls first (10)")
    p.add_argument("--repeats", type=int, default=50, help="timed calls; median reported (50)")
    p.add_argument("--copy-mib", type=int, default=1024, help="size of the copy test (1024)")
    p.add_argument("--skip-eager", action="store_true", help="skip the torch eager baselines")
    p.add_argument("--json", default="bench-out/kernels.json", help="JSON report path (bench-out/kernels.json)")
    p.add_argument("--seed", type=int, default=0, help="seed of images, crops and flips (0)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="run every case tiny on CPU under TRITON_INTERPRET=1: checks the "
                        "script's logic where there is no GPU; its timings mean nothing")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- timing

def time_call(fn, device, warmup: int, repeats: int) -> tuple[float, float]:
    """(median seconds per call with a cold L2, seconds per call back to back)."""
    import torch
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), statistics.median(times)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats + 1)]
    torch.cuda.synchronize()
    for start, end in events[:-1]:
        flush.zero_()  # evict inputs from L2; also hides this call's launch latency
        start.record()
        fn()
        end.record()
    start, end = events[-1]
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    cold = statistics.median(s.elapsed_time(e) for s, e in events[:-1]) / 1e3
    return cold, start.elapsed_time(end) / 1e3 / repeats


# ----------------------------------------------------------------------------- cases

def make_inputs(args, device):
    """Random batch, crop corners, RandomResizedCrop-style boxes and flips (seeded)."""
    import math
    import torch
    g = torch.Generator().manual_seed(args.seed)
    n, s, o = args.batch, args.in_size, args.out_size
    images = torch.randint(0, 256, (n, s, s, 3), dtype=torch.uint8, generator=g)
    top = torch.randint(0, s - o + 1, (n,), generator=g)
    left = torch.randint(0, s - o + 1, (n,), generator=g)
    boxes = []
    for _ in range(n):  # torchvision RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3))
        area = s * s * (0.08 + 0.92 * float(torch.rand(1, generator=g)))
        ratio = math.exp(math.log(3 / 4) + math.log(16 / 9) * float(torch.rand(1, generator=g)))
        bw = min(s, max(1, round(math.sqrt(area * ratio))))
        bh = min(s, max(1, round(math.sqrt(area / ratio))))
        boxes.append([int(torch.randint(0, s - bh + 1, (1,), generator=g)),
                      int(torch.randint(0, s - bw + 1, (1,), generator=g)), bh, bw])
    boxes = torch.tensor(boxes)
    fh, fv = torch.rand(n, generator=g) < 0.5, torch.zeros(n, dtype=torch.bool)
    return [t.to(device) for t in (images, top, left, boxes, fh, fv)]


def eager_crop(images, top, left, size, fh, fv, dtype):
    """What one writes in torch: gather rows/cols (with flips), permute, float, normalise."""
    import torch
    ar = torch.arange(size, device=images.device)
    ys = top[:, None] + torch.where(fv[:, None], size - 1 - ar, ar)
    xs = left[:, None] + torch.where(fh[:, None], size - 1 - ar, ar)
    batch = torch.arange(images.shape[0], device=images.device)[:, None, None]
    x = images[batch, ys[:, :, None], xs[:, None, :]].permute(0, 3, 1, 2)
    if dtype == torch.uint8:
        return x.contiguous()
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1)
    return ((x.float() / 255 - mean) / std).to(dtype).contiguous()


def eager_crop_loop(images, top, left, size, fh, fv, dtype):
    """The per-sample loop version: slice, flip, stack, then the same tail."""
    import torch
    crops = []
    for img, t, l, h in zip(images, top.tolist(), left.tolist(), fh.tolist()):
        c = img[t:t + size, l:l + size]
        crops.append(c.flip(1) if h else c)
    x = torch.stack(crops).permute(0, 3, 1, 2)
    if dtype == torch.uint8:
        return x.contiguous()
    return ((x.float() / 255 - torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1))
            / torch.tensor(STD, device=x.device).view(1, 3, 1, 1)).to(dtype).contiguous()


def eager_resize_batch(images, size, dtype):
    """Lower bound for eager resize: one interpolate of the whole batch (no per-box crop)."""
    import torch
    import torch.nn.functional as F
    x = F.interpolate(images.permute(0, 3, 1, 2).float(), size=(size, size), mode="bilinear",
                      align_corners=False)
    if dtype == torch.uint8:
        return x.round().clamp(0, 255).to(torch.uint8)
    mean = torch.tensor(MEAN, device=x.device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=x.device).view(1, 3, 1, 1) * 255
    return ((x - mean) / std).to(dtype)


def cases(args, device):
    """Yield (op, dtype name, variant, fn, bytes moved) for every timed case."""
    import torch
    from dlpack_io.kernels import crop_flip_permute, reference, resized_crop
    images, top, left, boxes, fh, fv = make_inputs(args, device)
    n, o = args.batch, args.out_size
    src = torch.empty(args.copy_mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    yield "copy", "uint8", "torch copy_", lambda: dst.copy_(src), 2 * src.numel()
    box_bytes = int((boxes[:, 2] * boxes[:, 3]).sum()) * 3
    for name in args.dtypes.split(","):
        dt = getattr(torch, name)
        norm = {} if dt == torch.uint8 else {"mean": MEAN, "std": STD}
        out_bytes = n * 3 * o * o * dt.itemsize
        crop_bytes = n * o * o * 3 + out_bytes
        yield "crop_flip_permute", name, "triton", lambda dt=dt, norm=norm: crop_flip_permute(
            images, top, left, o, o, fh, fv, out_dtype=dt, validate=False, **norm), crop_bytes
        if name == "float16":
            yield "crop_flip_permute", name, "triton validate=True", lambda: crop_flip_permute(
                images, top, left, o, o, fh, fv, out_dtype=dt, **norm), crop_bytes
        for aa in (False, True):
            yield ("resized_crop", name, "triton antialias" if aa else "triton",
                   lambda dt=dt, norm=norm, aa=aa: resized_crop(
                       images, boxes, o, fh, fv, out_dtype=dt, antialias=aa, validate=False,
                       **norm), box_bytes + out_bytes)
        if args.skip_eager:
            continue
        yield "crop_flip_permute", name, "eager gather", lambda dt=dt: eager_crop(
            images, top, left, o, fh, fv, dt), crop_bytes
        yield "crop_flip_permute", name, "eager loop", lambda dt=dt: eager_crop_loop(
            images, top, left, o, fh, fv, dt), crop_bytes
        yield "resized_crop", name, "eager per-box interpolate", \
            lambda dt=dt, norm=norm: reference.resized_crop(
                images, boxes, o, fh, fv, out_dtype=dt, validate=False, **norm), \
            box_bytes + out_bytes
        yield "resized_crop", name, "eager batch interpolate (no crop)", \
            lambda dt=dt: eager_resize_batch(images, o, dt), images.numel() + out_bytes


def verify(args, device) -> list[str]:
    """Compare every kernel output with the torch reference on the benchmark inputs."""
    import torch
    from dlpack_io.kernels import crop_flip_permute, reference, resized_crop
    images, top, left, boxes, fh, fv = make_inputs(args, device)
    o, problems = args.out_size, []
    atol = {"uint8": 1, "float16": 2**-9, "bfloat16": 2**-6, "float32": 1e-5}
    for name in args.dtypes.split(","):
        dt = getattr(torch, name)
        kw = dict(out_dtype=dt, **({} if dt == torch.uint8 else {"mean": MEAN, "std": STD}))
        pairs = [("crop_flip_permute", crop_flip_permute(images, top, left, o, o, fh, fv, **kw),
                  reference.crop_flip_permute(images, top, left, o, o, fh, fv, **kw), 0)]
        for aa in (False, True):
            pairs.append((f"resized_crop antialias={aa}",
                          resized_crop(images, boxes, o, fh, fv, antialias=aa, **kw),
                          reference.resized_crop(images, boxes, o, fh, fv, antialias=aa, **kw),
                          atol[name]))
        for what, got, want, tol in pairs:
            err = float((got.float() - want.float()).abs().max())
            if err > tol:
                problems.append(f"{what} {name}: max |kernel - reference| = {err:g} > {tol:g}")
    return problems


# ----------------------------------------------------------------------------- report

def run_bench(args, device) -> list[dict]:
    """Time every case; return one row per case."""
    rows = []
    for op, dtype, variant, fn, nbytes in cases(args, device):
        cold, loop = time_call(fn, device, args.warmup, args.repeats)
        rows.append({"op": op, "dtype": dtype, "variant": variant, "bytes": nbytes,
                     "us": cold * 1e6, "loop_us": loop * 1e6, "GBps": nbytes / cold / 1e9})
        print(f"  {op:18s} {dtype:8s} {variant:34s} {cold * 1e6:10.1f} us", file=sys.stderr)
    return rows


def summarise(rows: list[dict]) -> list[str]:
    """Add copy fractions and eager speedups to rows; return markdown lines."""
    copy = next(r["GBps"] for r in rows if r["op"] == "copy")
    lines = ["| op | dtype | variant | us (cold L2) | us (loop) | GB/s | % of copy | vs best eager |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
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
        if r["variant"] != "triton":
            continue
        if r["op"] == "crop_flip_permute":
            ok = r["copy_fraction"] >= TARGETS["crop_copy_fraction"] and (
                r["vs_eager"] is None or r["vs_eager"] >= TARGETS["crop_vs_eager"])
            want = ">= 70% of copy and >= 5x eager"
        else:
            ok, want = r["copy_fraction"] >= TARGETS["resize_copy_fraction"], ">= 50% of copy"
        out.append(f"- {r['op']} {r['dtype']}: {100 * r['copy_fraction']:.0f}% of copy, "
                   f"{r['GBps']:.0f} GB/s (DALI crop_mirror_normalize ~2600 GB/s); "
                   f"target {want}: {'MET' if ok else 'NOT MET'}")
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
        args.batch, args.in_size, args.out_size = 2, 20, 12
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
    env = environment(device)
    problems = verify(args, device)
    print("correctness vs torch reference: " + ("OK" if not problems else "MISMATCH"),
          *problems, sep="\n  ", file=sys.stderr)
    rows = run_bench(args, device)
    lines = [f"# dlpack kernels on {env['device']}", "",
             f"torch {env['torch']}, triton {env['triton']}, CUDA {env['cuda']}; batch "
             f"{args.batch}, {args.in_size}x{args.in_size} -> {args.out_size}x{args.out_size}",
             ""] + summarise(rows) + [""] + verdicts(rows) + [
             "- kernel outputs vs torch reference: " + ("OK" if not problems else
                                                        "MISMATCH: " + "; ".join(problems))]
    if args.cpu_smoke:
        lines.append("\n(CPU smoke run under the Triton interpreter: timings are meaningless)")
    print("\n".join(lines))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    report = dict(env, args=vars(args), targets=TARGETS, rows=rows, verdicts=verdicts(rows),
                  correctness_problems=problems, cpu_smoke=args.cpu_smoke)
    path.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {path}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
