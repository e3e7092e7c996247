"""What one ``dlpack bench`` run measures: the source subset, the stores, the groups of specs.

Specs run in groups; within a group every spec has its own process and the group's epochs
are interleaved round by round. Every group holds the serial baseline with the same batch
size, so each speedup is a ratio measured in one run.
"""
from __future__ import annotations

import os

from dlpack_io.tools.bench.families import BY_SECTION, QUICK_CONVERT, Spec

QUICK_IMAGES = 1000
MAIN_BATCH = 256
SCALING_FAMILIES = ("serial", "multiprocessing", "dataloader-files", "ours-thread", "ours-process")
QUICK_SCALING_FAMILIES = ("serial", "dataloader-files", "ours-thread")


def subset_folder(src: str, out: str, count: int) -> str:
    """Hard-link the first ``count`` images (canonical scan order) into out/src-<count>."""
    from dlpack_io.packer.scan import scan_image_folder

    inputs = scan_image_folder(src)
    if len(inputs.paths) <= count:
        return src
    dst = os.path.join(out, f"src-{count}")
    for rel in inputs.paths[:count]:
        target = os.path.join(dst, rel)
        if not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                os.link(os.path.join(inputs.root, rel), target)
            except OSError:
                import shutil
                shutil.copyfile(os.path.join(inputs.root, rel), target)
    return dst


def _depth(store: str, mode: str) -> int:
    reads = BY_SECTION["convert"][store].reads[mode]
    return 0 if reads == "src" else 1 + _depth(reads, mode)


def stores_needed(converts, loaders, modes) -> list:
    """(store, mode) pairs: the convert families ``converts`` in every mode they support, the
    stores the ``loaders`` read, and the stores those are written from; a store comes after
    the one it reads (numpy-raw before the peers' raw stores)."""
    pairs = {(f.name, m) for f in converts for m in modes if m in f.reads}
    pairs |= {(f.reads[m], m) for f in loaders for m in modes if m in f.reads}
    todo = list(pairs)
    while todo:
        store, mode = todo.pop()
        reads = BY_SECTION["convert"][store].reads[mode]
        if reads != "src" and (reads, mode) not in pairs:
            pairs.add((reads, mode))
            todo.append((reads, mode))
    return sorted(pairs, key=lambda p: (_depth(*p), p[1], p[0]))


def convert_families(families, quick: bool) -> list:
    """The convert families a convert section times (--quick: no option variants)."""
    return [f for f in families if not quick or f.name in QUICK_CONVERT]


def main_groups(families, modes, workers) -> list:
    """Per mode and worker count: every family that supports it, batch 256, plus serial."""
    groups = []
    for mode in modes:
        for w in sorted({0, *workers}):
            specs = [Spec(f.name, mode, w, MAIN_BATCH) for f in families
                     if f.name != "serial" and mode in f.reads and w in f.worker_counts(workers)]
            if specs or w == 0:
                groups.append({"kind": "workers", "mode": mode, "workers": w,
                               "specs": [Spec("serial", mode, 0, MAIN_BATCH)] + specs})
    return groups


def batch_groups(families, modes, workers, batch_sizes, quick: bool) -> list:
    """Per batch size: serial + the scaling families at the largest worker count."""
    names = QUICK_SCALING_FAMILIES if quick else SCALING_FAMILIES
    chosen = [f for f in families if f.name in names and f.name != "serial"]
    top = max(workers)
    groups = []
    for mode in ([m for m in modes if m == "jpeg"] if quick else modes):
        for bs in batch_sizes:
            specs = [Spec(f.name, mode, top, bs) for f in chosen
                     if mode in f.reads and top in f.worker_counts(workers)]
            groups.append({"kind": "batch", "mode": mode, "batch_size": bs,
                           "specs": [Spec("serial", mode, 0, bs)] + specs})
    return groups
