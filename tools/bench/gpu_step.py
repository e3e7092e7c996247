"""Exposed data time per training step on a GPU (issue 14 item 1), before/after staging.

    python -m dlpack_io.tools.bench.gpu_step                 # GPU: table + bench-out/gpu_step.json
    python -m dlpack_io.tools.bench.gpu_step --cpu-smoke     # tiny, CPU: checks the logic only

A ResNet-50-like network (plain torch.nn: bottleneck stages 3-4-6-3, bfloat16 autocast,
channels_last, SGD) trains on batches of ImageNet-like JPEGs (synthetic, about 500x375,
made by ``dlpack_io.tools.synth`` and packed once into ``--work-dir``), transformed on the
GPU with ``RandomResizedCrop(224)``, a flip and ``Normalize`` to float16. Each step is
``next(loader)``, forward, backward, SGD, then ``loss.item()``: the per-step sync of a loop
that logs its loss, the case where a copy issued late is exposed. Contenders, interleaved
round by round (one epoch each per round, the first ``--warmup`` steps untimed):

* ``resident``: one batch kept on the GPU: the step alone (the floor);
* ``staged``: ``Loader(device="cuda")`` as shipped (batch k+1's host->device copy starts
  on a side stream before batch k is yielded);
* ``unstaged``: the same Loader under :func:`no_staging` (the copy of batch k is issued
  only when batch k is due, as before issue 14 item 1).

Exposed data time = median step time with the loader - median step time of ``resident``;
issue 14's target: under 5% of the step (about 5 ms of ~100 ms on an H100 at batch 256).
Also reported: the median host wait inside ``next()``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

TARGET_FRACTION = 0.05
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def parse_args(argv=None) -> argparse.Namespace:
    """Command-line options (defaults: the ImageNet training case on one GPU)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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


@contextlib.contextmanager
def no_staging():
    """Within this block Loaders deliver as before staging existed: batch k+1 is taken from
    the workers early, but its copy is issued only when it is due (patches the Loader's
    private ``_stage`` helper; fails loudly if that helper has gone)."""
    from dlpack_io.reader.batch import loader as loader_mod

    real = loader_mod._stage

    def take_only(runner, finisher, ticket):
        try:
            return runner.get(ticket)
        except Exception as exc:  # noqa: BLE001 - delivered when due, as _stage does
            return exc
    loader_mod._stage = take_only
    try:
        yield
    finally:
        loader_mod._stage = real


# ---------------------------------------------------------------------------- the model
def resnet50_like(width: int = 64, blocks=(3, 4, 6, 3), classes: int = 1000):
    """ResNet-50's layout in plain torch.nn (no torchvision): 7x7 stem, bottleneck stages."""
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = 4 * mid
            self.body = nn.Sequential(
                nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
                nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True), nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.skip(x))

    layers = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
              nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = width
    for stage, count in enumerate(blocks):
        for j in range(count):
            layers.append(Bottleneck(cin, width * 2**stage, 2 if j == 0 and stage else 1))
            cin = 4 * width * 2**stage
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def make_step(model, device):
    """``step(images, labels) -> loss``: forward, backward and SGD (bfloat16 autocast on CUDA)."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    amp = device.type == "cuda"

    def step(images, labels):
        x = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model(x if amp else x.float()), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


# ---------------------------------------------------------------------------- data
def _write_images(job) -> None:
    """(In a pool process) write images ``start..stop`` of the synthetic folder."""
    root, start, stop, size, classes = job
    import numpy as np
    from PIL import Image

    from dlpack_io.tools.synth import photo_like

    for i in range(start, stop):
        rng = np.random.default_rng(i)
        h, w = (int(s * rng.uniform(0.85, 1.15)) for s in size)
        folder = Path(root) / f"class_{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo_like(rng, h, w)).save(folder / f"img_{i:07d}.jpg", quality=90)


def prepare_data(args, count: int, size=(375, 500), classes: int = 100) -> str:
    """A packed data set of ``count`` ImageNet-like JPEGs under ``--work-dir`` (made once,
    in parallel; reused when present)."""
    from concurrent.futures import ProcessPoolExecutor

    from dlpack_io.packer import convert

    dst = Path(args.work_dir) / f"packed-{count}-{size[0]}x{size[1]}"
    if (dst / "manifest.json").exists():
        return str(dst)
    src = Path(args.work_dir) / f"src-{count}-{size[0]}x{size[1]}"
    procs = os.cpu_count() or 1
    chunk = -(-count // procs)
    jobs = [(str(src), a, min(count, a + chunk), size, classes) for a in range(0, count, chunk)]
    with ProcessPoolExecutor(procs) as pool:
        list(pool.map(_write_images, jobs))
    convert(src, dst, mode="jpeg", workers=0, progress=False, overwrite=True)
    return str(dst)


# ---------------------------------------------------------------------------- timing
def run_steps(batches, step, warmup: int, steps: int) -> tuple[list, list]:
    """(host waits in next(), step times) in seconds of the timed steps. The epoch is left
    after them (a Loader then restarts its workers next round: the warm-up absorbs that)."""
    it = iter(batches)
    waits, times = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        images, labels = next(it)
        t1 = time.perf_counter()
        step(images, labels).item()  # the loop's per-step sync (logging the loss)
        t2 = time.perf_counter()
        if i >= warmup:
            waits.append(t1 - t0)
            times.append(t2 - t0)
    if hasattr(it, "close"):
        it.close()
    return waits, times


def contenders(args, ds, device):
    """name -> (make an iterable of one round's batches, context manager for the round)."""
    import torch

    from dlpack_io.reader import Loader, Normalize, RandomHorizontalFlip, RandomResizedCrop

    kw = dict(batch_size=args.batch, shuffle="global", drop_last=True, num_workers=args.workers,
              prefetch=args.prefetch or args.workers, dtype=torch.float16, device=device,
              device_transforms=True, transforms=[RandomResizedCrop(args.size),
                                                  RandomHorizontalFlip(), Normalize(MEAN, STD)])
    staged, unstaged = Loader(ds, **kw), Loader(ds, **kw)
    images, labels = next(iter(Loader(ds, **dict(kw, num_workers=0))))

    def epoch(loader):
        def make(r):
            loader.set_epoch(r)
            return loader
        return make
    resident = [(images, labels)] * (args.warmup + args.steps)
    return {"resident": (lambda r: resident, contextlib.nullcontext),
            "staged": (epoch(staged), contextlib.nullcontext),
            "unstaged": (epoch(unstaged), no_staging)}, (staged, unstaged)


def measure(args, ds, device) -> dict:
    """Interleaved rounds of every contender; per contender the raw step times and waits."""
    import torch

    torch.manual_seed(0)
    model = resnet50_like(args.width, **({"blocks": (1, 1, 1, 1)} if args.cpu_smoke else {}))
    model = model.to(device).to(memory_format=torch.channels_last)
    step = make_step(model, device)
    plan, loaders = contenders(args, ds, device)
    raw = {name: {"waits": [], "steps": []} for name in plan}
    try:
        for r in range(args.rounds):
            for name, (make, context) in plan.items():
                with context():
                    waits, times = run_steps(make(r), step, args.warmup, args.steps)
                raw[name]["waits"] += waits
                raw[name]["steps"] += times
    finally:
        for loader in loaders:
            loader.close()
    return raw


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


if __name__ == "__main__":
    sys.exit(main())
