"""Data larger than RAM: ``shuffle="global"`` vs ``shuffle="block"`` with a small page cache.

    python -m benchmarks.larger_than_ram --root bench-out/ram --images 10000 \\
        --cache-mb 256 --rounds 3 --write docs/benchmarks.md

Contenders: the registry's "ram" section (tools/bench/families.py; ``--only`` picks some):
global, block 256x16 (the Loader's defaults), block 256x4, and global with madvise(MADV_RANDOM)
on the shard mappings (no kernel readahead), which the Loader does not do today. Each is built
by :func:`benchmarks.larger_than_ram.loader.ram_loader`.

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

# Modules: cache (page cache + /proc plumbing), cgroup (the memory cgroup and its governor),
# loader (the "ram" family's builder), epoch (one epoch in a child process), measure
# (rounds and summaries), report (the markdown section), main (the command).
