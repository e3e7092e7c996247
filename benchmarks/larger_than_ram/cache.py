"""Page-cache plumbing of the larger-than-RAM benchmark: /proc fields, the shard files,
evicting their pages (mapped ones included), and a poller that keeps peaks."""
from __future__ import annotations

import ctypes
import json
import os
import threading
from pathlib import Path

MB = 1 << 20
MADV_RANDOM, MADV_DONTNEED = 1, 4


def parse_fields(text: str) -> dict:
    """``name: value`` or ``name value`` lines (/proc/<pid>/io, memory.stat, status) -> ints
    (a ``kB`` unit is converted to bytes)."""
    out = {}
    for line in text.splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    return out


def read_fields(path: str) -> dict:
    """:func:`parse_fields` of the file at ``path``."""
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


class Peaks(threading.Thread):
    """Polls ``probe()`` (a dict of numbers) until stopped; keeps each key's maximum."""

    def __init__(self, probe, every: float = 0.05):
        super().__init__(daemon=True)
        self.probe, self.every, self.peak, self._stop_event = probe, every, {}, threading.Event()
        self.start()

    def run(self) -> None:
        """Poll until :meth:`stop` (the thread's body)."""
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
