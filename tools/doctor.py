"""``dlpack doctor DST``: how fast can this machine feed training from DST, and with what?

A short measured run with the user's transforms, on this machine:

* the decode-only rate: records decoded whole, one thread, no transforms (what one core
  gives when nothing else is done);
* an untimed warm-up first, so that every setting reads the same warm data;
* the Loader's rate for each candidate setting (worker count x thread/process workers),
  each run long enough to pass its start-up, with its ``loader.stats()`` (CPU per image,
  how busy the workers were), reading every field the data set has (boxes and masks moved
  with the image, as a training script that reads them pays for them) unless told fewer;
* the advice: the fastest setting within the machine's cores, named as a change only when
  it beats the setting in use (the Loader's default unless told) by a clear margin
  (``CLEAR_WIN``), else "keep" the setting in use; never more workers than cores;
* the training step it can feed: the advised setting's batches per second, i.e. a step
  faster than ``batch_size / rate`` seconds will wait for data.

It returns data (``diagnose``); the command prints it (``report_text``).
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from dlpack_io.reader import Workers

LOADER_DEFAULT = (2, "thread")  # Loader(num_workers=2, workers=Workers(kind="thread"))
CLEAR_WIN = 1.10  # another setting is advised over the one in use only when this much faster


@dataclass
class Trial:
    """One Loader setting, measured."""

    num_workers: int
    worker_kind: str
    images_per_s: float
    cpu_ms_per_image: float
    workers_busy: float
    batches: int
    fetched_bytes: int = 0  # from object storage while it ran (0: read locally)
    stage_shares: dict | None = None  # where the workers' time went (LoaderStats.stage_shares)


def decode_rate(dataset, seconds: float) -> float:
    """Images per second decoded whole (``dataset[i]``) by one thread, for ``seconds``."""
    n, start = 0, time.perf_counter()
    while n < len(dataset):
        dataset[n]
        n += 1
        if time.perf_counter() - start >= seconds:
            break
    return n / max(time.perf_counter() - start, 1e-9)


def all_fields(dataset) -> tuple:
    """What a training script reading everything gets: image, label and every field of the
    data set (boxes, categories and masks included)."""
    return ("image", "label") + tuple(getattr(dataset, "fields", None) or {})


def measure(dataset, transforms, batch_size: int, num_workers: int, worker_kind: str,
            seconds: float, sample_transform=None, fields=None) -> Trial:
    """Run the Loader with one setting (and the user's ``sample_transform``, if any), reading
    ``fields`` (default: all_fields), for about ``seconds`` (after its first batch, which
    pays the start-up); its figures."""
    from dlpack_io.reader import Loader

    loader = Loader(dataset, batch_size=batch_size, num_workers=num_workers,
                    workers=Workers(kind=worker_kind), transforms=list(transforms),
                    drop_last=False, sample_transform=sample_transform,
                    fields=fields or all_fields(dataset))
    try:
        images, start, epoch = 0, None, 0
        while start is None or time.perf_counter() - start < seconds:
            loader.set_epoch(epoch)
            for x, *_ in loader:
                if start is None:
                    start = time.perf_counter()  # the first batch: start-up, not counted
                    continue
                images += len(x)
                if time.perf_counter() - start >= seconds:
                    break
            epoch += 1
        stats = loader.stats().run
        elapsed = time.perf_counter() - start
        return Trial(num_workers, worker_kind, images / max(elapsed, 1e-9),
                     stats.cpu_ms_per_image, stats.workers_busy, stats.batches,
                     stats.fetched_bytes, stats.stage_shares())
    finally:
        loader.close()


def candidates(cores: int, kinds=("thread", "process")) -> list[tuple[int, str]]:
    """The settings worth trying on ``cores`` cores: 1, 2, 4, ... up to the core count, as
    threads; 2 up to the core count as processes (one process can hold a core only)."""
    counts, n = [], 1
    while n <= max(1, cores):
        counts.append(n)
        n *= 2
    out = [(c, "thread") for c in counts if "thread" in kinds]
    out += [(c, "process") for c in counts if c >= 2 and "process" in kinds]
    return out


def diagnose(dataset, transforms, *, batch_size: int, seconds: float, settings=None,
             sample_transform=None, fields=None, in_use=LOADER_DEFAULT) -> dict:
    """Measure ``dataset`` with ``transforms`` (and ``sample_transform``), reading ``fields``
    (default: all_fields): the decode-only rate, every setting of ``settings`` (default
    :func:`candidates` for this machine), the advice (see :func:`advise`; ``in_use``: the
    setting the training script has now) and the training step it can feed. Returns a
    dict (JSON-friendly)."""
    cores = len(os.sched_getaffinity(0))
    settings = settings or candidates(cores)
    fields = tuple(fields or all_fields(dataset))
    # Every trial reads the same first batches (epoch 0, one seed): an untimed warm-up with
    # the most workers reads them first, so the first setting measured does not pay alone
    # for a cold page cache or a cold object-storage cache.
    warmup = measure(dataset, transforms, batch_size, *max(settings), seconds, sample_transform,
                     fields)
    trials = [measure(dataset, transforms, batch_size, w, kind, seconds, sample_transform,
                      fields) for w, kind in settings]
    best, advice = advise(trials, cores, tuple(in_use))
    step = advice or best
    return {"cores": cores, "batch_size": batch_size, "images": len(dataset),
            "fields": list(fields), "in_use": list(in_use), "warmup": asdict(warmup),
            "decode_only_images_per_s": decode_rate(dataset, seconds),
            "trials": [asdict(t) for t in trials], "best": asdict(best),
            "advice": None if advice is None else dict(asdict(advice), change=(
                advice.num_workers, advice.worker_kind) != tuple(in_use)),
            "fastest_step_ms": 1000 * batch_size / step.images_per_s
            if step.images_per_s else float("inf")}


def advise(trials: list, cores: int, in_use: tuple) -> tuple:
    """(the fastest trial within ``cores`` workers, else the fastest; the setting to use:
    that one when it beats the setting ``in_use`` by CLEAR_WIN or ``in_use`` was not
    measured, else ``in_use``'s trial; None when no measured setting fits the cores)."""
    fits = [t for t in trials if t.num_workers <= max(1, cores)]
    best = max(fits or trials, key=lambda t: t.images_per_s)
    if not fits:
        return best, None
    now = next((t for t in fits if (t.num_workers, t.worker_kind) == in_use), None)
    if now is not None and best.images_per_s < CLEAR_WIN * now.images_per_s:
        return best, now  # not a clear win: nothing to change
    return best, best


def report_text(report: dict) -> str:
    """The diagnosis as a table and two lines of advice."""
    warm = report["warmup"]
    lines = [f"{report['images']} images, batch {report['batch_size']}, {report['cores']} cores,"
             f" fields {', '.join(report['fields'])}",
             f"warm-up (not counted): {warm['batches']} batches with {warm['num_workers']} "
             f"{warm['worker_kind']} workers, {warm['fetched_bytes']:,} bytes fetched",
             f"decode only (1 thread, no transforms): {report['decode_only_images_per_s']:,.0f} "
             "images/s",
             "", "| workers | kind | images/s | CPU-ms/image | workers busy | worker time |",
             "|---|---|---|---|---|---|"]
    for t in report["trials"]:
        where = ", ".join(f"{k} {100 * v:.0f}%" for k, v in (t["stage_shares"] or {}).items())
        lines.append(f"| {t['num_workers']} | {t['worker_kind']} | {t['images_per_s']:,.0f} | "
                     f"{t['cpu_ms_per_image']:.2f} | {100 * t['workers_busy']:.0f}% | {where} |")
    return "\n".join(lines + [""] + advice_lines(report))


def advice_lines(report: dict) -> list:
    """What to do: change to the advised setting, or keep the one in use; never a setting
    in use named as a change, never more workers than cores."""
    advice = report["advice"]
    if advice is None:
        return [f"no measured setting fits the {report['cores']} cores (more workers than "
                f"cores only contend): measure num_workers <= {report['cores']}"]
    setting = f"num_workers={advice['num_workers']}, workers=Workers(kind={advice['worker_kind']!r})"
    if advice["change"]:
        head = f"recommended: Loader(..., {setting}): {advice['images_per_s']:,.0f} images/s"
    else:
        head = (f"keep Loader(..., {setting}), the setting in use: "
                f"{advice['images_per_s']:,.0f} images/s; no setting measured was "
                f"{100 * (CLEAR_WIN - 1):.0f}% faster")
    return [head, f"it feeds a training step of {report['fastest_step_ms']:.1f} ms or more per "
                  f"batch of {report['batch_size']} without waiting; a faster step is "
                  f"data-bound here"]
