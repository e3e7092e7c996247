"""One epoch of the larger-than-RAM benchmark in a fresh child process.

The parent (:func:`run_epoch`) starts ``python -m benchmarks.larger_than_ram.epoch SPEC``,
waits for "ready" (Loader built, shards mapped, cache dropped), limits the child's page
cache (cgroup method) and says "go"; the child (:func:`child`) reads the epoch and replies
with its figures, one JSON line each way.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from benchmarks import child_env
from benchmarks.larger_than_ram.cache import (MADV_DONTNEED, Peaks, advise_mappings, drop_cache,
                                              read_fields, shard_files)
from benchmarks.larger_than_ram.cgroup import MemCgroup


# ---- child -----------------------------------------------------------------------------
def _send(obj) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _dropper(files, budget: int, stop: threading.Event) -> None:
    """Fallback cache limit: drop the shards' pages whenever ``budget`` more bytes were read."""
    last = read_fields("/proc/self/io")["read_bytes"]
    while not stop.wait(0.02):
        now = read_fields("/proc/self/io")["read_bytes"]
        if now - last >= budget:
            advise_mappings(files, MADV_DONTNEED)
            drop_cache(files)
            last = now


def _start_cache(files, warm: bool) -> None:
    """Drop every page of the (mapped) shards: the epoch starts cold, its index pages
    re-faulting as they would; or warm: every page cached."""
    from dlpack_io.tools.pagecache import warm as read_all

    advise_mappings(files, MADV_DONTNEED)
    drop_cache(files)
    if warm:
        read_all(*files)


def _read_epoch(loader, files, fadvise_budget: int) -> dict:
    """Iterate the epoch under the fallback limit (if any); time, bytes read, indices seen."""
    import numpy as np

    stop = threading.Event()
    dropper = threading.Thread(target=_dropper, args=(files, fadvise_budget, stop),
                               daemon=True) if fadvise_budget else None
    peaks = Peaks(lambda: read_fields("/proc/self/status"))
    read0 = read_fields("/proc/self/io")["read_bytes"]  # thread workers included
    if dropper:
        dropper.start()
    seen, start = [], time.perf_counter()
    for _, _, indices in loader:
        seen.append(indices)
    seconds = time.perf_counter() - start
    read = read_fields("/proc/self/io")["read_bytes"] - read0
    stop.set()
    status = peaks.stop()
    return {"seen": np.concatenate(seen) if seen else np.zeros(0, np.int64),
            "seconds": seconds, "read": read, "status": status}


def child(spec: dict) -> None:
    """Build the family's Loader, say ready, wait for "go", read one epoch, reply with the
    figures."""
    from dlpack_io.tools.bench.families import BY_SECTION, build

    loader = build(BY_SECTION["ram"][spec["family"]], spec["path"], spec["mode"], spec["crop"],
                   spec["batch"], spec["workers"])
    loader.set_epoch(spec["epoch"])
    files = shard_files(spec["path"])
    _start_cache(files, spec["warm"])
    _send({"ready": True, "anon": read_fields("/proc/self/status")["RssAnon"]})
    if sys.stdin.readline().strip() != "go":
        return
    got = _read_epoch(loader, files, spec["fadvise_budget"])
    loader.close()
    seen, status = got["seen"], got["status"]
    _send({"images": len(seen), "seconds": got["seconds"], "read_bytes": got["read"],
           "payload_bytes": int(loader.dataset.lookup(seen)[2]["length"].sum()),
           "peak_anon": status.get("RssAnon", 0), "peak_file": status.get("RssFile", 0)})


# ---- parent ----------------------------------------------------------------------------
def run_epoch(spec: dict, *, method: str, cache_bytes: int | None, cgroup_root=None,
              warm: bool = False) -> dict:
    """One epoch in a fresh child under ``method`` ("none", "cgroup" or "fadvise"), with the
    data set's pages dropped (or all cached: ``warm``) when it starts."""
    spec = dict(spec, warm=warm, fadvise_budget=cache_bytes if method == "fadvise" else 0)
    proc = subprocess.Popen([sys.executable, "-m", __spec__.name, json.dumps(spec)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=child_env())
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


if __name__ == "__main__":
    child(json.loads(sys.argv[1]))
