"""Where the CPU of a cold epoch 0 over s3:// goes, against the same epoch from local disk:
CPU per image of the loader process split by thread (decode workers, the planner's event
loop, its executor threads that land records, obstore's Tokio threads, the training loop)
and into user and system time, plus the SeaweedFS server's CPU and the loader's stats().

    python -m benchmarks.remote_cpu SRC_JPEG_FOLDER [--rounds 3] [--batch-size 128]
        [--out /tmp/remote-cpu] [--perf] [--split] [--fill 4,16] [--rtt-ms 20]
        [--local-cold] [--shard-size 16MB]

Per round: local epoch 0, then s3:// epoch 0 with a fresh cache_dir (RandomResizedCrop 224
+ flip, 2 thread workers, as benchmarks.remote_epochs). Per-thread CPU comes from
``/proc/self/task/*/schedstat`` (nanoseconds on a CPU), read every 10 ms by a sampler thread
and once more at the end: a thread that exits loses at most its last 10 ms. ``--perf`` also
records every CPU of the machine (``perf record -a -g``) during the local and the s3://
epochs (OUT/perf-local.data, OUT/perf-s3.data; ``perf report --pid PID --sort comm,dso``,
PID printed); threads carry their Python names for that. ``--split`` also splits the
receiving threads' CPU (ranges received in place) into its parts, per image: signing the
URL, sending the request, reading the response's head, reading the body off the socket
(``readinto``: the kernel's TCP receive) and what the sink does with each read (CRCs,
``pwrite`` into the growing file), each timed by its thread's CPU clock around the call.
``--local-cold`` drops the local shards from the page cache before the local epoch
(its pages are allocated as it reads, as the s3:// epoch's are as they land) instead of
reading them once before it. ``--fill A,B`` runs the s3:// epoch once per fill range size
(MiB, the planner's ``fill_bytes``), alternated within each round; ``--rtt-ms`` puts a
latency proxy (tools/bench/latencyproxy.py, its own process) between loader and server;
``--shard-size`` packs the local data set with that shard size (the converter's default
is 256MB; 16MB gives 1,000 images several shards).
Prints one JSON line per epoch and the medians.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import threading
import time

_GROUPS = (("dlpack-prefetch", "planner loop"), ("asyncio", "landing (executor)"),
           ("dlpack-land", "landing (one thread)"), ("dlpack-receive", "receiving (direct)"),
           ("tokio", "obstore (Tokio)"), ("dlpack-loader", "decode workers"))


def name_threads() -> None:
    """Give each Python thread its Python name as the OS thread name (for perf and /proc)."""
    libc, run = ctypes.CDLL(None), threading.Thread.run

    def named(self):
        libc.prctl(15, self.name[:15].encode(), 0, 0, 0)  # PR_SET_NAME
        run(self)
    threading.Thread.run = named


def _tasks() -> dict:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # exited meanwhile
            continue
        out[int(tid)] = (comm, ns)
    return out


class ThreadCPU:
    """CPU seconds per thread name group between start() and stop() (sampled, see above)."""

    def __init__(self):
        self.seen, self.base, self._stop = {}, {}, threading.Event()

    def start(self) -> None:
        self.base = {t: ns for t, (_, ns) in _tasks().items()}
        self._thread = threading.Thread(target=self._poll, name="cpu-sampler", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.01):
            self.seen.update(_tasks())

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self.seen.update(_tasks())
        groups: dict = {}
        for tid, (comm, ns) in self.seen.items():
            if comm == "cpu-sampler":
                continue
            name = next((g for prefix, g in _GROUPS if comm.startswith(prefix)),
                        "training loop" if tid == os.getpid() else f"other ({comm[:9]})")
            groups[name] = groups.get(name, 0.0) + (ns - self.base.get(tid, 0)) / 1e9
        return groups


def epoch(ds, batch_size: int, server_pid: int, perf=None) -> dict:
    """One epoch of ``ds`` (RandomResizedCrop 224 + flip, 2 thread workers): images/s, CPU
    per image of this process (whole, user, system, per thread group) and of the server."""
    from dlpack_io.reader import Loader, RandomHorizontalFlip, RandomResizedCrop
    from dlpack_io.reader.batch.stats import proc_cpu

    loader = Loader(ds, batch_size=batch_size, num_workers=2, seed=0, drop_last=False,
                    transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])
    threads, r0 = ThreadCPU(), resource.getrusage(resource.RUSAGE_SELF)
    s0 = proc_cpu([server_pid])
    threads.start()
    if perf is not None:
        perf.enable(True)
    t0, n, first = time.perf_counter(), 0, None
    for _, labels in loader:
        n += len(labels)
        first = first or time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    if perf is not None:
        perf.enable(False)
    st = loader.stats()
    loader.close()
    per_thread, r1 = threads.stop(), resource.getrusage(resource.RUSAGE_SELF)
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    ms = 1e3 / n
    return {"images_per_s": round(n / seconds), "first_batch_s": round(first, 3),
            "cpu_ms_per_image": round((user + system) * ms, 3),
            "user_ms": round(user * ms, 3), "sys_ms": round(system * ms, 3),
            "threads_ms": {k: round(v * ms, 3) for k, v in sorted(per_thread.items())},
            "server_ms": round((proc_cpu([server_pid]) - s0) * ms, 3),
            "minflt": r1.ru_minflt - r0.ru_minflt, "wait_s": round(st.wait_s, 3),
            "fetch_wait_s": round(st.fetch_wait_s, 3), "decode_s": round(st.decode_s, 3),
            "loadavg": open("/proc/loadavg").read().split()[0]}


class _Split:
    """``--split``: thread CPU seconds of each part of ``Store.receive_range`` (wrapped here,
    in this benchmark's process only), summed over the receiving threads."""

    PARTS = ("sign", "request", "response head", "body off the socket", "sink (CRC, pwrite)")

    def __init__(self):
        import http.client

        from dlpack_io.reader.remote.storage import Store
        self.sums, self._lock = dict.fromkeys(self.PARTS, 0.0), threading.Lock()
        self._timed(Store, "_signed", "sign")
        self._timed(http.client.HTTPConnection, "request", "request")
        self._timed(http.client.HTTPConnection, "getresponse", "response head")
        self._timed(http.client.HTTPResponse, "readinto", "body off the socket")
        receive = Store.receive_range
        split = self

        def receive_range(store, name, start, end, *, etag, sink):
            got = sink.got

            def timed_got(n):
                t = time.thread_time()
                try:
                    return got(n)
                finally:
                    split.add("sink (CRC, pwrite)", time.thread_time() - t)
            sink.got = timed_got
            return receive(store, name, start, end, etag=etag, sink=sink)
        Store.receive_range = receive_range

    def _timed(self, owner, attr: str, part: str) -> None:
        call, split = getattr(owner, attr), self

        def timed(*args, **kwargs):
            t = time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                split.add(part, time.thread_time() - t)
        setattr(owner, attr, timed)

    def add(self, part: str, seconds: float) -> None:
        """Count ``seconds`` of thread CPU to ``part``."""
        with self._lock:
            self.sums[part] += seconds

    def take(self, images: int) -> dict:
        """ms per image of each part since the last call; the sums start again."""
        with self._lock:
            out = {k: round(v / images * 1e3, 4) for k, v in self.sums.items()}
            self.sums = dict.fromkeys(self.PARTS, 0.0)
        return out


def setup(src: str, out: str, shard_size: str = "16MB"):
    """Pack ``src`` once into OUT/local (16 MB shards: several for 1,000 images; the
    converter's default is 256MB); a fresh SeaweedFS folder; the local data set's path."""
    from dlpack_io.packer import convert

    local_dir = os.path.join(out, "local")
    if not os.path.exists(os.path.join(local_dir, "manifest.json")):
        convert(src, local_dir, shard_size=shard_size, progress=False)
    shutil.rmtree(os.path.join(out, "seaweed"), ignore_errors=True)
    return local_dir


def _evict(local_dir: str) -> None:
    """Drop the local shards' pages from the page cache (``--local-cold``: the local epoch
    reads from the disk, allocating page-cache pages as a cold s3:// epoch does)."""
    from benchmarks.larger_than_ram.cache import drop_cache

    drop_cache([os.path.join(local_dir, name) for name in os.listdir(local_dir)])


def _reread(local_dir: str) -> None:
    """Read the local shards once (a warm page cache for the local epoch, as the bucket's
    bytes are warm in the server's)."""
    for name in os.listdir(local_dir):
        with open(os.path.join(local_dir, name), "rb") as f:
            while f.read(1 << 22):
                pass


class _Perf:
    """``perf record -a -g`` of every CPU, switched on only around one kind of epoch."""

    def __init__(self, path: str):
        self.fifo = path + ".ctl"
        for p in (self.fifo, self.fifo + ".ack"):
            if os.path.exists(p):
                os.unlink(p)
            os.mkfifo(p)
        self.proc = subprocess.Popen(
            ["perf", "record", "-a", "-g", "-F", "999", "-D", "-1", "-o", path,
             "--control", f"fifo:{self.fifo},{self.fifo}.ack"], stderr=subprocess.DEVNULL)
        self.ctl, self.ack = open(self.fifo, "w"), open(self.fifo + ".ack")

    def enable(self, on: bool) -> None:
        """Start (True) or stop recording; returns once perf has acknowledged."""
        self.ctl.write("enable\n" if on else "disable\n")
        self.ctl.flush()
        self.ack.readline()

    def close(self) -> None:
        """Stop perf and let it write its file."""
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait()


def main() -> None:
    """Run the rounds (see the module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--out", default="/tmp/remote-cpu")
    parser.add_argument("--perf", action="store_true")
    parser.add_argument("--split", action="store_true")
    parser.add_argument("--fill", default=None,
                        help="fill range sizes in MiB, comma-separated (default: the planner's)")
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--shard-size", default="16MB",
                        help="of the data set packed into OUT/local (when it is not there yet)")
    parser.add_argument("--local-cold", action="store_true",
                        help="the local epoch from the disk, not from the page cache")
    args = parser.parse_args()
    name_threads()
    split = _Split() if args.split else None
    from dlpack_io.reader import Dataset
    from dlpack_io.reader.remote.storage import Store
    from dlpack_io.tools.bench.latencyproxy import LatencyProxy
    from dlpack_io.tools.bench.seaweed import SeaweedServer

    local_dir = setup(args.src, args.out, args.shard_size)
    fills = [None] if args.fill is None else [int(float(m) * 2**20)
                                               for m in args.fill.split(",")]
    with SeaweedServer(os.path.join(args.out, "seaweed"), buckets=["bench"]) as server, \
            contextlib.ExitStack() as stack:
        os.environ.update(server.env())
        store = Store("s3://bench/ds")
        for name in os.listdir(local_dir):
            store.put_file(name, os.path.join(local_dir, name))
        if args.rtt_ms:  # (after the upload: only the loader's requests pay the latency)
            host, port = server.endpoint.split("//", 1)[1].rsplit(":", 1)
            proxy = stack.enter_context(LatencyProxy(host, int(port), rtt=args.rtt_ms / 1e3))
            os.environ["AWS_ENDPOINT_URL"] = proxy.endpoint
        pid, rows = server.proc.pid, []
        print(json.dumps({"loader_pid": os.getpid(), "server_pid": pid}), flush=True)
        perf = {side: _Perf(os.path.join(args.out, f"perf-{side}.data"))
                for side in ("local", "s3")} if args.perf else {}
        for _ in range(args.rounds):
            cache = os.path.join(args.out, "cache")
            shutil.rmtree(cache, ignore_errors=True)
            (_evict if args.local_cold else _reread)(local_dir)
            row = {"local_e0": epoch(Dataset(local_dir), args.batch_size, pid,
                                      perf.get("local"))}
            for fill in fills:
                shutil.rmtree(cache, ignore_errors=True)
                remote = Dataset("s3://bench/ds", cache_dir=cache)
                if fill is not None:
                    remote._remote.fetch_options["fill_bytes"] = fill
                side = "s3_e0" if fill is None else f"s3_e0 fill {fill / 2**20:g} MiB"
                row[side] = epoch(remote, args.batch_size, pid, perf.get("s3"))
                row[side]["fetching_threads_ms"] = round(sum(
                    v for k, v in row[side]["threads_ms"].items()
                    if k not in ("decode workers", "training loop")), 3)
                if split is not None:
                    row[side]["receiving_split_ms"] = split.take(len(Dataset(local_dir)))
            print(json.dumps(row), flush=True)
            rows.append(row)
        for p in perf.values():
            p.close()
    for side in rows[0]:
        keys = ("images_per_s", "first_batch_s", "cpu_ms_per_image", "user_ms", "sys_ms",
                "server_ms") + (("fetching_threads_ms",) if side != "local_e0" else ())
        print(side, {k: statistics.median(r[side][k] for r in rows) for k in keys})


if __name__ == "__main__":
    main()
