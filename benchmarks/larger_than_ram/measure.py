"""Rounds of the larger-than-RAM benchmark: every contender limited and, as the reference,
unlimited (cold, warm), in an order rotated each round; medians and ratios to global."""
from __future__ import annotations

import json
import logging
import os
import statistics
from pathlib import Path

from benchmarks.larger_than_ram.cache import MB, shard_files
from benchmarks.larger_than_ram.epoch import run_epoch
from benchmarks.larger_than_ram.loader import geometry

log = logging.getLogger(__name__)


def contenders(only=None) -> dict:
    """name -> Family of the registry's "ram" section (``only``: those names; "global", the
    baseline of every ratio, is always in)."""
    from dlpack_io.tools.bench import families

    families.check_only(only, ["ram"])
    chosen = {f.name: f for f in families.select("ram", only)}
    return {"global": families.BY_SECTION["ram"]["global"], **chosen}


def _summary(runs: list) -> dict:
    """Medians (and every run's value) of images/s, GB read and read / bytes of the records."""
    out = {"rates": [r["images"] / r["seconds"] for r in runs],
           "read_gb": [r["read_bytes"] / 1e9 for r in runs],
           "amplification": [r["read_bytes"] / max(r["payload_bytes"], 1) for r in runs]}
    out.update({f"median_{k}": statistics.median(v) for k, v in list(out.items())})
    for key in ("cg_majfault", "cg_cache_peak", "cg_rss_peak", "cg_oom_stalls"):
        if runs and all(key in r for r in runs):
            out[key] = statistics.median(r[key] for r in runs)
    return out


def readahead_kb(path) -> int | None:
    """read_ahead_kb of the block device holding ``path`` (None if not a block device)."""
    st = os.stat(path)
    dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    for queue in (dev / "queue", dev / ".." / "queue"):  # a disk, or a partition of one
        if (queue / "read_ahead_kb").exists():
            return int((queue / "read_ahead_kb").read_text())
    return None


def _rounds(mode: str, path: Path, args, method: str, table: dict) -> dict:
    """(label, state) -> the epochs' figures, ``args.rounds`` rounds, rotated each round."""
    base = {"path": str(path), "mode": mode, "crop": args.crop, "batch": args.batch,
            "workers": args.workers}
    jobs = [(label, state) for state in ["limited"] + args.reference for label in table]
    runs = {job: [] for job in jobs}
    for rnd in range(args.rounds):
        for label, state in jobs[rnd % len(jobs):] + jobs[:rnd % len(jobs)]:
            limited = state == "limited"
            runs[label, state].append(run_epoch(
                dict(base, epoch=rnd + 1, family=label), method=method if limited else "none",
                cache_bytes=args.cache_mb * MB if limited else None,
                cgroup_root=args.cgroup_root, warm=state == "warm"))
            log.info("%s %s %s round %d: %s", mode, label, state, rnd, runs[label, state][-1])
    return runs


def _mixing(path: Path, table: dict, batch: int, data_bytes: int, samples: int) -> dict:
    """label -> `dlpack inspect --order`'s mixing figures for its shuffle, and the bytes a
    block window reads (its working set)."""
    from dlpack_io.tools.order_report import order_report

    out = {}
    for label, family in table.items():
        (size, window), shuffle = geometry(family), family.options["shuffle"]
        q = order_report(path, shuffle=shuffle, block_size=size, window=window,
                         batch_size=batch)["quality"][shuffle]
        out[label] = dict(q, shuffle=shuffle, working_set=size * window * data_bytes
                          / max(1, samples))
    return out


def bench_mode(mode: str, path: Path, args, method: str) -> dict:
    """Rounds of limited and reference (no limit: cold, warm) epochs, rotated each round."""
    table = contenders(args.only)
    manifest = json.loads((path / "manifest.json").read_text())
    data_bytes = sum(f.stat().st_size for f in shard_files(path))
    runs = _rounds(mode, path, args, method, table)
    res = {"data_bytes": data_bytes, "num_samples": manifest["num_samples"],
           "packing": {**manifest.get("lossless", {}), **manifest.get("reencoded", {})},
           "readahead_kb": readahead_kb(path), "quality": {},  # filled last; the key keeps its JSON place
           "labels": {name: f.label for name, f in table.items()},
           "reference": {label: {state: _summary(runs[label, state]) for state in args.reference}
                         for label in table},
           "runs": {f"{label}, {state}": r for (label, state), r in runs.items()}}
    res["limited"] = {label: dict(_summary(runs[label, "limited"]), vs_global=statistics.median(
        (r["images"] / r["seconds"]) / (g["images"] / g["seconds"])
        for r, g in zip(runs[label, "limited"], runs["global", "limited"]))) for label in table}
    res["quality"] = _mixing(path, table, args.batch, data_bytes, manifest["num_samples"])
    return res
