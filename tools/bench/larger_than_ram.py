"""Data larger than RAM: ``shuffle="global"`` vs ``shuffle="block"`` with a small page cache.

    python -m dlpack_io.tools.bench.larger_than_ram --root bench-out/ram --images 10000 \\
        --cache-mb 256 --rounds 3 --write docs/benchmarks.md

Contenders: the registry's "ram" section (tools/bench/families.py; ``--only`` picks some):
global, block 256x16 (the Loader's defaults), block 256x4, and global with madvise(MADV_RANDOM)
on the shard mappings (no kernel readahead), which the Loader does not do today. Each is built
by :func:`ram_loader`.

Data: ``--images`` ImageNet-like JPEGs (tools/synth.py), packed once in jpeg mode and in raw
mode (``--raw-size``). Every epoch runs in a fresh child process: the contender's Loader
(batch 256, 2 thread workers, uint8 CPU output; jpeg: RandomResizedCrop + flip, raw:
RandomCrop + flip) whose shards are mapped, then dropped from the page cache (madvise +
posix_fadvise DONTNEED), so the epoch starts cold. The page cache is limited in one of two
ways (``--method``):
  * ``cgroup``: the child is moved into a new cgroup v1 memory cgroup (page cache is charged
    to the cgroup that reads it) whose limit a thread keeps at the anonymous memory charged
    to it (memory.stat ``rss``, polled every 20 ms) + ``--cache-mb``; OOM killer off (a task
    at the limit waits for the next raise); the cgroup is removed after the epoch;
  * ``fadvise`` (where cgroups are not writable): a thread in the child drops every cached
    page of the shards each time the process has read ``--cache-mb`` more -- cruder than
    the kernel's LRU under a limit.
Measured per epoch: images/s; read_bytes from /proc/self/io (the process and its thread
workers) against the bytes of the records it delivered; with a cgroup, its major faults and
the peak of its page cache. Each of ``--rounds`` rounds runs every contender limited and, as
the reference, without a limit (cold and warm start), in an order rotated each round;
medians, and the median of the per-round ratios to global.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from dlpack_io.reader.batch.order import DEFAULT_BLOCK_SIZE, DEFAULT_WINDOW

log = logging.getLogger(__name__)
MB = 1 << 20
SECTION = "## Data larger than RAM: global vs block"


# ---- /proc, page cache and cgroup plumbing ---------------------------------------------
def parse_fields(text: str) -> dict:
    """``name: value`` or ``name value`` lines (/proc/<pid>/io, memory.stat, status) -> ints
    (a ``kB`` unit is converted to bytes)."""
    out = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    return out


def _read_fields(path: str) -> dict:
    with open(path) as f:
        return parse_fields(f.read())


def shard_files(path) -> list[Path]:
    """The shard files of the packed data set at ``path`` (from its manifest)."""
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    return [Path(path) / s["name"] for s in manifest["shards"]]


def drop_cache(files) -> None:
    """Evict the cached pages of ``files`` (written back first, so dirty pages go too)."""
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


MADV_RANDOM, MADV_DONTNEED = 1, 4


def advise_mappings(files, advice: int) -> None:
    """madvise() every mapping of ``files`` in this process (MADV_DONTNEED: fadvise leaves
    mapped pages alone, so they must leave the page tables first; they re-fault from the
    file)."""
    names, libc = {os.path.realpath(f) for f in files}, ctypes.CDLL(None, use_errno=True)
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() in names:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), advice) != 0:
                    raise OSError(ctypes.get_errno(), f"madvise({advice}) of {fields[5].strip()}")


class MemCgroup:
    """A cgroup v1 memory cgroup under ``root``, created now, removed by :meth:`remove`."""

    def __init__(self, root, name: str):
        self.path = Path(root) / name
        self.path.mkdir()

    def _write(self, name: str, value) -> None:
        (self.path / name).write_text(f"{value}\n")

    def limit(self, nbytes: int) -> None:
        """Cap memory (anonymous + page cache) charged to the group."""
        self._write("memory.limit_in_bytes", int(nbytes))

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group."""
        self._write("cgroup.procs", pid)

    def no_oom_kill(self) -> None:
        """Make a task that hits the limit wait for more memory instead of being killed."""
        self._write("memory.oom_control", 1)

    def confine(self, pid: int, cache_bytes: int) -> "Peaks":
        """Move ``pid`` in, with ``cache_bytes`` of page cache from now on; the running
        :class:`Peaks` of the group's memory.stat (see :func:`governor`)."""
        self.no_oom_kill()
        probe = governor(self, cache_bytes)
        probe()  # the first limit: nothing charged yet
        self.add(pid)
        return Peaks(probe, every=0.02)

    def stat(self) -> dict:
        """memory.stat plus under_oom, max_usage_in_bytes and failcnt."""
        out = _read_fields(str(self.path / "memory.stat"))
        out["under_oom"] = _read_fields(str(self.path / "memory.oom_control"))["under_oom"]
        for name in ("max_usage_in_bytes", "failcnt"):
            out[name] = int((self.path / f"memory.{name}").read_text())
        return out

    def remove(self) -> None:
        """rmdir the group (its tasks have exited; retried while the kernel lets them go)."""
        for attempt in range(50):
            try:
                return self.path.rmdir()
            except FileNotFoundError:
                return None
            except OSError:
                if attempt == 49:
                    raise
                time.sleep(0.1)


def cgroup_usable(root) -> bool:
    """Whether a memory cgroup can be created (and removed) under ``root``."""
    try:
        MemCgroup(root, f"dlpack-ltr-probe-{os.getpid()}").remove()
        return (Path(root) / "memory.limit_in_bytes").exists()
    except OSError:
        return False


def cgroup_limit(anon: int, cache_bytes: int) -> int:
    """The limit that leaves ``cache_bytes`` of page cache to a group using ``anon`` bytes of
    anonymous memory now (page-rounded)."""
    return -(-(anon + cache_bytes) // 4096) * 4096


def governor(group: "MemCgroup", cache_bytes: int):
    """A probe for :class:`Peaks` that also keeps ``group``'s limit at its anonymous memory
    + ``cache_bytes``: the Loader's buffers grow and shrink during an epoch, and a fixed limit
    would leave the page cache whatever they do not use. Only memory charged after the move
    counts (the child's earlier memory stays charged where it was). A task that hits the limit
    waits (the OOM killer is off in the group) until the next call raises it."""
    state = {"limit": 0, "stalls": 0}

    def probe() -> dict:
        st = group.stat()
        target = cgroup_limit(st["rss"], cache_bytes)
        if st["under_oom"]:  # an allocation waits: anonymous memory outgrew the limit
            state["stalls"] += 1
            target = max(target, state["limit"] + max(cache_bytes, 64 * MB))
        if abs(target - state["limit"]) > MB:
            try:
                group.limit(target)
                state["limit"] = target
            except OSError:  # EBUSY: not reclaimable yet; the next call tries again
                pass
        return dict(st, oom_stalls=state["stalls"])
    return probe


class Peaks(threading.Thread):
    """Polls ``probe()`` (a dict of numbers) until stopped; keeps each key's maximum."""

    def __init__(self, probe, every: float = 0.05):
        super().__init__(daemon=True)
        self.probe, self.every, self.peak, self._stop_event = probe, every, {}, threading.Event()
        self.start()

    def run(self) -> None:
        while True:
            try:
                for k, v in self.probe().items():
                    self.peak[k] = max(v, self.peak.get(k, v))
            except OSError:  # the process or group went away while we looked
                pass
            if self._stop_event.wait(self.every):
                return

    def stop(self) -> dict:
        """Stop polling; the peaks."""
        self._stop_event.set()
        self.join()
        return self.peak


# ---- child: one epoch ------------------------------------------------------------------
def _send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _dropper(files, budget: int, stop: threading.Event) -> None:
    """Fallback cache limit: drop the shards' pages whenever ``budget`` more bytes were read."""
    last = _read_fields("/proc/self/io")["read_bytes"]
    while not stop.wait(0.02):
        now = _read_fields("/proc/self/io")["read_bytes"]
        if now - last >= budget:
            advise_mappings(files, MADV_DONTNEED)
            drop_cache(files)
            last = now


ADVICE = {None: 0, "random": MADV_RANDOM}  # ram_loader's ``advice`` -> madvise() advice


def ram_loader(path, mode: str, crop: int, batch_size: int, workers: int, *, shuffle: str,
               block_size: int = DEFAULT_BLOCK_SIZE, block_window: int = DEFAULT_WINDOW,
               advice: str | None = None,
               seed: int = 0):
    """The "ram" section's builder (families.py): a Loader over the data set at ``path``
    (thread workers, uint8 CPU output, ``return_index=True``; jpeg: RandomResizedCrop(crop),
    raw: RandomCrop(crop); + flip) whose shards are already mapped, with madvise ``advice``
    (None: the kernel's default; "random": MADV_RANDOM, no readahead, which the Loader does
    not do itself) on every shard mapping of this process."""
    import numpy as np

    from dlpack_io.reader import Dataset, Loader, RandomCrop, RandomHorizontalFlip, RandomResizedCrop

    if advice not in ADVICE:
        raise ValueError(f"advice={advice!r}: expected one of {sorted(map(str, ADVICE))}")
    resize = (RandomResizedCrop if mode == "jpeg" else RandomCrop)(crop)
    loader = Loader(Dataset(path), batch_size=batch_size, shuffle=shuffle, seed=seed,
                    block_size=block_size, block_window=block_window, num_workers=workers,
                    transforms=[resize, RandomHorizontalFlip()], return_index=True)
    loader.dataset.lookup(np.arange(len(loader.dataset)))  # maps every shard
    if ADVICE[advice]:
        advise_mappings(shard_files(path), ADVICE[advice])
    return loader


def _start_cache(files, warm: bool) -> None:
    """Drop every page of the (mapped) shards: the epoch starts cold, its index pages
    re-faulting as they would; or warm: every page cached."""
    from dlpack_io.tools.pagecache import warm as read_all

    advise_mappings(files, MADV_DONTNEED)
    drop_cache(files)
    if warm:
        read_all(*files)


def child(spec: dict) -> None:
    """Build the family's Loader, say ready, wait for "go", read one epoch, reply with the
    figures."""
    import numpy as np

    from dlpack_io.tools.bench.families import BY_SECTION, build

    loader = build(BY_SECTION["ram"][spec["family"]], spec["path"], spec["mode"], spec["crop"],
                   spec["batch"], spec["workers"])
    loader.set_epoch(spec["epoch"])
    files = shard_files(spec["path"])
    _start_cache(files, spec["warm"])
    _send({"ready": True, "anon": _read_fields("/proc/self/status")["RssAnon"]})
    if sys.stdin.readline().strip() != "go":
        return
    stop = threading.Event()
    dropper = threading.Thread(target=_dropper, args=(files, spec["fadvise_budget"], stop),
                               daemon=True) if spec["fadvise_budget"] else None
    peaks = Peaks(lambda: _read_fields("/proc/self/status"))
    read0 = _read_fields("/proc/self/io")["read_bytes"]  # thread workers included
    if dropper:
        dropper.start()
    seen, start = [], time.perf_counter()
    for _, _, indices in loader:
        seen.append(indices)
    seconds = time.perf_counter() - start
    read = _read_fields("/proc/self/io")["read_bytes"] - read0
    stop.set()
    status = peaks.stop()
    loader.close()
    seen = np.concatenate(seen) if seen else np.zeros(0, np.int64)
    _send({"images": len(seen), "seconds": seconds, "read_bytes": read,
           "payload_bytes": int(loader.dataset.lookup(seen)[2]["length"].sum()),
           "peak_anon": status.get("RssAnon", 0), "peak_file": status.get("RssFile", 0)})


# ---- parent: runs, rounds, summaries ---------------------------------------------------
def run_epoch(spec: dict, *, method: str, cache_bytes: int | None, cgroup_root=None,
              warm: bool = False) -> dict:
    """One epoch in a fresh child under ``method`` ("none", "cgroup" or "fadvise"), with the
    data set's pages dropped (or all cached: ``warm``) when it starts."""
    spec = dict(spec, warm=warm, fadvise_budget=cache_bytes if method == "fadvise" else 0)
    proc = subprocess.Popen([sys.executable, "-m", __spec__.name, "--child", json.dumps(spec)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    group = peaks = None
    try:
        ready = json.loads(proc.stdout.readline() or "{}")
        if not ready.get("ready"):
            raise RuntimeError(f"epoch child for {spec['path']} failed to start (exit "
                               f"{proc.wait()}); its error is above")
        out = {"anon_ready": ready["anon"]}
        if method == "cgroup":
            group = MemCgroup(cgroup_root, f"dlpack-ltr-{os.getpid()}-{proc.pid}")
            peaks = group.confine(proc.pid, cache_bytes)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if proc.wait() != 0 or not line:
            raise RuntimeError(f"epoch child for {spec['path']} died (exit {proc.returncode}; "
                               f"its error is above)")
        out.update(json.loads(line))
        if group is not None:
            peak, final = peaks.stop(), group.stat()
            out.update(cg_cache_peak=peak["cache"], cg_rss_peak=peak["rss"],
                       cg_majfault=final["pgmajfault"], cg_oom_stalls=peak["oom_stalls"])
        return out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if peaks is not None and peaks.is_alive():
            peaks.stop()
        if group is not None:
            group.remove()


def contenders(only=None) -> dict:
    """name -> Family of the registry's "ram" section (``only``: those names; "global", the
    baseline of every ratio, is always in)."""
    from dlpack_io.tools.bench import families

    families.check_only(only, ["ram"])
    chosen = {f.name: f for f in families.select("ram", only)}
    return {"global": families.BY_SECTION["ram"]["global"], **chosen}


def geometry(family) -> tuple[int, int]:
    """(block_size, block_window) the family's Loader uses (ram_loader's defaults)."""
    return (family.options.get("block_size", DEFAULT_BLOCK_SIZE),
            family.options.get("block_window", DEFAULT_WINDOW))


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


def bench_mode(mode: str, path: Path, args, method: str) -> dict:
    """Rounds of limited and reference (no limit: cold, warm) epochs, rotated each round."""
    from dlpack_io.tools.order_report import order_report

    table = contenders(args.only)
    manifest = json.loads((path / "manifest.json").read_text())
    data_bytes = sum(f.stat().st_size for f in shard_files(path))
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
    res = {"data_bytes": data_bytes, "num_samples": manifest["num_samples"],
           "packing": {**manifest.get("lossless", {}), **manifest.get("reencoded", {})},
           "readahead_kb": readahead_kb(path), "quality": {},
           "labels": {name: f.label for name, f in table.items()},
           "reference": {label: {state: _summary(runs[label, state]) for state in args.reference}
                         for label in table},
           "runs": {f"{label}, {state}": r for (label, state), r in runs.items()}}
    res["limited"] = {label: dict(_summary(runs[label, "limited"]), vs_global=statistics.median(
        (r["images"] / r["seconds"]) / (g["images"] / g["seconds"])
        for r, g in zip(runs[label, "limited"], runs["global", "limited"]))) for label in table}
    for label, family in table.items():
        (size, window), shuffle = geometry(family), family.options["shuffle"]
        q = order_report(path, shuffle=shuffle, block_size=size, window=window,
                         batch_size=args.batch)["quality"][shuffle]
        res["quality"][label] = dict(q, shuffle=shuffle, working_set=size * window * data_bytes
                                     / max(1, manifest["num_samples"]))
    return res


# ---- report ----------------------------------------------------------------------------
def _rounds(values, fmt="{:.0f}") -> str:
    return "[" + ", ".join(fmt.format(v) for v in values) + "]"


def _row(label: str, cache: str, s: dict) -> str:
    cg = (f"{s['cg_majfault']:,.0f} | {s['cg_cache_peak'] / MB:,.0f} MB" if "cg_majfault" in s
          else " | ")
    tail = f"{_rounds(s['rates'])}; {_rounds(s['amplification'], '{:.2f}')}"
    return (f"| {label} | {cache} | {s['median_rates']:,.0f} | {s['median_read_gb']:.2f} | "
            f"{s['median_amplification']:.2f} | {cg} | {tail} |")


HOW = """Each epoch is a fresh process reading the whole data set once with the Loader (batch
256, 2 thread workers, uint8 CPU output; jpeg: `RandomResizedCrop(224)` + flip, raw:
`RandomCrop(224)` + flip), starting with none of it in the page cache. *page cache*: the
limit (cgroup: the process runs in a cgroup v1 memory cgroup whose limit is kept at its
anonymous memory + the cache allowed; fadvise: the shards' pages are dropped each time that
much more was read), or none (cold: nothing cached at the start; warm: everything cached).
*read / records' bytes*: read_bytes of /proc/self/io (the process and its threads) over the
bytes of the records the epoch delivered; 1.0 = every record read once (below 1 where an
epoch leaves bytes untouched: a raw 224 crop reads 224 of 256 rows). *major faults*, *cache peak*: the cgroup's memory.stat. The Loader maps shards
with the default advice, so a page-cache miss makes the kernel read `read_ahead_kb` around
the fault; in a random order those neighbours are evicted before they are used once the data
set is larger than the cache. A block-shuffle window reads `block_size x block_window x mean
record size` bytes (*window working set*); when that fits in the cache, what is read ahead
is used first. *global, MADV_RANDOM* is not a Loader option: global order with
madvise(MADV_RANDOM) on the shard mappings, so the kernel reads only the pages touched.
Mixing: `dlpack inspect DST --order` figures (distinct classes and shards per batch of 256,
against a uniformly random batch). The machine is shared with other agents' builds, tests
and benchmarks on its 2 cores: images/s move with their load (in the rounds column); read
volumes, and ratios within a round, hold better."""


def markdown(res: dict) -> str:
    """The docs/benchmarks.md section for the results of :func:`main`."""
    lines = [SECTION, "", f"Produced by `{res['command']}`.", "",
             f"Measured {res['date']} on {res['machine']}; page cache limited by "
             f"**{res['method']}** to {res['cache_mb']} MB. {res['context']}", "",
             f"Data: {res['data']}.", "", HOW, ""]
    for mode, m in res["modes"].items():
        show = m.get("labels", {})  # family name -> label (a saved run before: labels)
        lines += [f"### {mode} records: {m['num_samples']:,} samples, {m['data_bytes'] / MB:,.0f} "
                  f"MB ({m['data_bytes'] / (res['cache_mb'] * MB):.1f}x the cache), device "
                  f"read_ahead_kb {m['readahead_kb']}", "",
                  *(["Records: " + ", ".join(f"{k}: {v:,}" for k, v in m["packing"].items())
                     + ".", ""] if m.get("packing") else []),
                  "| shuffle | page cache | images/s (median) | GB read (median) | read / "
                  "records' bytes (median) | major faults | cache peak | rounds: images/s; "
                  "read / records' bytes |", "|---|---|---:|---:|---:|---:|---:|---|"]
        lines += [_row(show.get(name, name), f"no limit, {state}", s)
                  for name, ref in m["reference"].items() for state, s in ref.items()]
        lines += [_row(show.get(name, name), f"{res['cache_mb']} MB", s)
                  for name, s in m["limited"].items()]
        lines += ["", "| shuffle | images/s / global's, same round (median) | classes/batch "
                      "(perfect) | class mix | shards/batch (perfect) | shard mix | window "
                      "working set |", "|---|---:|---:|---:|---:|---:|---:|"]
        for name, s in m["limited"].items():
            q, label = m["quality"][name], show.get(name, name)
            block = q.get("shuffle", label.split()[0]) == "block"
            ws = f"{q['working_set'] / MB:,.0f} MB" if block else ""
            lines.append(f"| {label} | {s['vs_global']:.2f} | {q['classes_per_batch']:.1f} "
                         f"({q['perfect_classes_per_batch']:.1f}) | {q['class_mix']:.2f} | "
                         f"{q['shards_per_batch']:.1f} ({q['perfect_shards_per_batch']:.1f}) | "
                         f"{q['shard_mix']:.2f} | {ws} |")
        lines.append("")
    return "\n".join(lines)


def write_section(path, text: str) -> None:
    """Replace (or append) this benchmark's section of a markdown file."""
    p = Path(path)
    old = p.read_text() if p.exists() else "# Benchmarks\n"
    start = old.find(SECTION)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + 1)
        new = old[:start] + text.rstrip("\n") + "\n" + ("" if end < 0 else old[end:])
    p.write_text(new)


def prepare(root: Path, args) -> dict:
    """Create (once) the JPEG folder and its jpeg- and raw-mode packings."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    src = root / "jpegs"
    if not src.exists():
        make_image_folder(src, args.images, num_classes=100, seed=0, size=args.image_size)
    paths = {}
    for mode in args.modes:
        paths[mode] = root / f"ds_{mode}"
        if not (paths[mode] / "manifest.json").exists():
            convert(src, paths[mode], mode=mode, size=args.raw_size if mode == "raw" else None,
                    shard_size=args.shard_size, workers=2, progress=False, overwrite=True)
    return paths


def _names() -> list:
    from dlpack_io.tools.bench.families import BY_SECTION

    return list(BY_SECTION["ram"])


def _arguments(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("--root", type=Path, default=Path("bench-out/ram"), help="work folder (data is kept)")
    add("--images", type=int, default=10000, help="JPEGs to synthesise (~110 KB each)")
    add("--image-size", type=lambda s: tuple(int(x) for x in s.split("x")), default=(375, 500),
        help="HxW of the synthetic JPEGs")
    add("--modes", nargs="+", choices=("jpeg", "raw"), default=["jpeg", "raw"])
    add("--raw-size", type=int, default=256, help="side of raw-mode records")
    add("--shard-size", default="64MB", help="dlpack convert --shard-size")
    add("--crop", type=int, default=224, help="output side (RandomResizedCrop / RandomCrop)")
    add("--batch", type=int, default=256)
    add("--workers", type=int, default=2, help="thread workers")
    add("--only", help="comma-separated contenders of the registry's \"ram\" section "
        "(tools/bench/families.py; default: all): " + ", ".join(_names())
        + "; global, the baseline, always runs")
    add("--cache-mb", type=int, default=256, help="page cache allowed to the epoch")
    add("--method", choices=("auto", "cgroup", "fadvise"), default="auto")
    add("--cgroup-root", default="/sys/fs/cgroup/memory", help="cgroup v1 memory hierarchy")
    add("--rounds", type=int, default=3, help="rounds (medians)")
    add("--reference", nargs="*", choices=("cold", "warm"), default=["cold", "warm"],
        help="unlimited reference epochs per shuffle (none: --reference alone)")
    add("--json", type=Path, help="write all results here")
    add("--write", help="markdown file whose section to (re)write")
    add("--render", type=Path, help="only print/--write the report of a saved --json")
    add("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    """Run the benchmark; print (and optionally write into docs) the results."""
    args = _arguments(argv)
    if args.child:
        return child(json.loads(args.child))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.render:
        return _report(json.loads(args.render.read_text()), args)
    try:
        contenders(args.only)
    except ValueError as exc:  # before any data is made
        raise SystemExit(str(exc)) from None
    method = args.method
    if method == "auto":
        method = "cgroup" if cgroup_usable(args.cgroup_root) else "fadvise"
    elif method == "cgroup" and not cgroup_usable(args.cgroup_root):
        raise SystemExit(f"{args.cgroup_root}: cannot create a cgroup v1 memory cgroup here "
                         f"(not root, or not a v1 memory hierarchy); use --method fadvise")
    paths = prepare(args.root, args)
    load0, started = os.getloadavg()[0], time.time()
    res = {"method": method, "cache_mb": args.cache_mb, "modes": {}, "data": (
        f"{args.images:,} synthetic ImageNet-like JPEGs (`tools/synth.py`, about "
        f"{args.image_size[1]}x{args.image_size[0]}, 100 classes) packed by `dlpack convert` "
        f"with `--shard-size {args.shard_size}` in jpeg mode and in raw mode (`--size "
        f"{args.raw_size}`)")}
    for mode, path in paths.items():
        res["modes"][mode] = bench_mode(mode, path, args, method)
    res.update(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               machine=f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB",
               context=f"1-minute load average {load0:.2f} before, {os.getloadavg()[0]:.2f} "
                       f"after ({time.time() - started:.0f} s).",
               command="python -m dlpack_io.tools.bench.larger_than_ram " +
                       " ".join(sys.argv[1:] if argv is None else argv))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return _report(res, args)


def _report(res: dict, args) -> dict:
    text = markdown(res)
    print(text)
    if args.write:
        write_section(args.write, text)
    return res


if __name__ == "__main__":
    main()
