"""Which S3 client should the prefetch planner use? Measure, don't guess.

The planner's work is many ~100 KB range GETs with many in flight. This script starts a real
SeaweedFS server and the latency proxy, uploads one object, and times the same set of range
requests with each client, interleaved round by round, at each added round trip::

    python -m benchmarks.remote_clients [--rtts 0,20] [--requests 400] [--rounds 3]

Contenders (the registry's "s3-client" section, families.py): boto3 (one client, a
ThreadPoolExecutor of N threads, N = in-flight requests) and obstore (Rust, async: N ``get_range_async`` calls gathered under a semaphore, run on a
fresh event loop per batch). Reported: requests/s (median of rounds) and CPU seconds per 1,000
requests of this process (the client's own cost; the server and proxy run in their own
processes).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dlpack_io.tools.bench.latencyproxy import LatencyProxy
from dlpack_io.tools.bench.seaweed import SeaweedServer

BUCKET, KEY = "clientbench", "blob"
RECORD = 110_000


def _ranges(n: int, size: int, seed: int) -> list[tuple[int, int]]:
    starts = np.random.default_rng(seed).choice(size // RECORD, n, replace=False) * RECORD
    return [(int(s), int(s) + RECORD) for s in starts]


def boto3_fetch(env, endpoint, ranges, inflight):
    """Fetch ``ranges`` with boto3 from a thread pool of ``inflight`` threads."""
    import boto3
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                          config=Config(max_pool_connections=inflight,
                                        retries={"mode": "standard", "max_attempts": 3}))

    def one(r):
        body = client.get_object(Bucket=BUCKET, Key=KEY, Range=f"bytes={r[0]}-{r[1] - 1}")["Body"]
        return len(body.read())

    def run():
        with ThreadPoolExecutor(inflight) as pool:
            return sum(pool.map(one, ranges))
    return run


def obstore_fetch(env, endpoint, ranges, inflight):
    """Fetch ``ranges`` with obstore: ``inflight`` concurrent get_range_async calls."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, region="us-east-1",
                    access_key_id=env["AWS_ACCESS_KEY_ID"],
                    secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                    client_options={"allow_http": True, "pool_max_idle_per_host": str(inflight)})

    async def gather():
        sem = asyncio.Semaphore(inflight)

        async def one(r):
            async with sem:
                return len(await obstore.get_range_async(store, KEY, start=r[0], end=r[1]))
        return sum(await asyncio.gather(*(one(r) for r in ranges)))

    return lambda: asyncio.run(gather())


def _time(fn) -> tuple[float, float]:
    import resource

    def cpu():
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    c0, t0 = cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu() - c0


def measure(*, rtts=(0, 20), requests: int = 400, rounds: int = 3, inflight=(16, 64)) -> list:
    """Rows of {client, rtt_ms, inflight, requests_per_s, cpu_s_per_1000}."""
    from dlpack_io.tools.bench.families import build, select

    clients, rows = select("s3-client"), []
    with tempfile.TemporaryDirectory() as tmp, SeaweedServer(tmp, buckets=[BUCKET]) as server:
        env = server.env()
        size = (requests * 3) * RECORD
        data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
        boto3_fetch(env, server.endpoint, [], 1)  # import cost outside the timing
        import boto3
        boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                     aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"]).put_object(
            Bucket=BUCKET, Key=KEY, Body=data)
        for rtt in rtts:
            with LatencyProxy("127.0.0.1", server.port, rtt=rtt / 1000) as proxy:
                for n in inflight:
                    times = {c.name: [] for c in clients}
                    for rnd in range(rounds):  # interleaved: each round runs every client
                        ranges = _ranges(requests, size, seed=rnd)
                        for c in clients:
                            times[c.name].append(_time(build(c, env, proxy.endpoint, ranges, n)))
                    for name, samples in times.items():
                        wall = statistics.median(s[0] for s in samples)
                        cpu = statistics.median(s[1] for s in samples)
                        rows.append({"client": name, "rtt_ms": rtt, "inflight": n,
                                     "requests_per_s": round(requests / wall, 1),
                                     "cpu_s_per_1000": round(cpu / requests * 1000, 3)})
    return rows


def markdown(rows) -> str:
    """The rows as a markdown table."""
    out = ["| client | added RTT | in flight | requests/s | CPU s per 1,000 requests |",
           "|---|---|---|---|---|"]
    out += [f"| {r['client']} | {r['rtt_ms']} ms | {r['inflight']} | {r['requests_per_s']} | "
            f"{r['cpu_s_per_1000']} |" for r in rows]
    return "\n".join(out)


def main(argv=None) -> None:
    """Command line entry point."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rtts", default="0,20")
    p.add_argument("--inflight", default="16,64")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rows = measure(rtts=[int(x) for x in a.rtts.split(",")], requests=a.requests,
                   rounds=a.rounds, inflight=[int(x) for x in a.inflight.split(",")])
    print(json.dumps(rows, indent=1) if a.json else markdown(rows))


if __name__ == "__main__":
    main()
