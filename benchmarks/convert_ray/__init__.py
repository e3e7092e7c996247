"""Conversion benchmark: ``--engine ray`` against the local engine on the same CPUs.

    unshare --net sh -c 'ip link set lo up && python -m benchmarks.convert_ray'
        [--images 3000] [--cpus 2] [--repeats 5] [--shard-size 256MB] [--out bench-out]

(from the repository root; ``unshare --net``, as root, keeps every Ray process on loopback;
without it Ray listens on and talks to the machine's network address.) Contenders (the
registry's "ray" section, tools/bench/families.py), interleaved round by round from a
warm page cache (files re-read, untimed, before each run), medians of the repeats:

* ``local``: ``convert(..., workers=CPUS)``, the default engine.
* ``ray, cluster running``: a one-node cluster of CPUS CPUs was started before the clock
  (``ray start --head --num-cpus CPUS``); timed: connect, convert, disconnect.
* ``ray, private cluster``: no address, so ``convert`` starts Ray itself (``ray.init``
  with CPUS CPUs) and stops it: what ``dlpack convert --engine ray`` costs on one machine.

Besides wall time it records ``pack_s`` (the conversion's own ``seconds``: scan, connect
and manifest excluded), the CPU seconds of every process doing the work (driver, the local
engine's workers, the Ray node's raylet, GCS and workers; the private cluster is not
sampled), the fixed costs (importing ray, connecting, starting and stopping a cluster),
the marginal rates and the driver's costs per image and per shard (slopes against smaller
runs), and a larger job (``--larger K``: every image listed K times) where the start-up
weighs less. On a machine shared with other jobs the engine with more processes gets more
of the CPU, so compare the CPU columns too: with nothing else running, both engines keep
every core busy and images/s goes as 1 / CPU seconds.
"""

# Modules: rayhost (a head node on loopback, CPU-counting cgroups), engines (the "ray"
# family's builders, timing, interleaved rounds), driver (marginal rates and the driver's
# costs), report (the markdown tables), main (the command).
