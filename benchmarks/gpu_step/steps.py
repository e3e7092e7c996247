"""The step benchmark's contenders (resident batch, staged Loader, unstaged Loader), the
``no_staging`` switch, and the interleaved timed rounds."""
from __future__ import annotations

import contextlib
import time

from benchmarks.gpu_step.model import make_step, resnet50_like

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@contextlib.contextmanager
def no_staging():
    """Within this block Loaders deliver as before staging existed: batch k+1 is taken from
    the workers early, but its copy is issued only when it is due (patches the Loader's
    ``stage_next`` step in reader/batch/pipeline.py: the reader has no option for
    it, and the before/after comparison must run the shipped code otherwise unchanged;
    fails loudly if that step has gone)."""
    from dlpack_io.reader.batch import pipeline as engine

    real = engine.stage_next

    def take_only(runner, finisher, ticket):
        try:
            return runner.get(ticket)
        except Exception as exc:  # noqa: BLE001 - delivered when due, as stage_next does
            return exc
    engine.stage_next = take_only
    try:
        yield
    finally:
        engine.stage_next = real


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
