"""Ray workers (``Workers(kind="ray")``) against thread workers on the same machine: CPU per
image, bytes moved per image, images/s with a simulated 2 ms inter-node delay, and images/s
as Ray nodes (CPUs) are added.

    python -m benchmarks.ray_workers [--root /tmp/ray-workers] [--images 1024]
        [--batch-size 64] [--repeats 3] [--out results.json]

Packs ``--images`` ImageNet-sized JPEGs (about 500x375) once. The recipe is the baseline
(RandomResizedCrop 224, flip, Normalize, float16 batches on the CPU); the training step is
empty, so the loader is the bottleneck and whatever it cannot hide shows in images/s.
Every run is a driver process of its own (Ray connects once per process): it reads one
warm-up epoch (actors start, page cache warm), then ``--repeats`` timed epochs, whose
medians are reported. Contenders, interleaved round by round:

* ``threads``: ``num_workers=2`` thread workers (CPU: the process's).
* ``ray``: ``num_workers=2`` actors on a one-node cluster of 2 CPUs started before the
  clock (``ray start --head``); CPU: the driver's plus every process of the cluster
  (raylet, GCS, agents, actors), counted by a cgroup (exited processes included).
* ``ray + 2 ms``: the same on a second cluster whose nodes, and the driver, delay every
  actor task message by 2 ms each way (Ray's own fault injection,
  ``RAY_testing_asio_delay_us`` on ``CoreWorkerService`` ``PushTask``, client and server:
  the request reaches the actor 2 ms late and its reply reaches the driver 2 ms late; the
  batch's bytes are in the same node's object store). Also at batch size 8, where 4 ms is a
  larger share of a batch.
* scaling: a head node without CPUs for actors (the training node: the driver, and the
  object store its batches land in) and k = 1, 2, 3 worker nodes of one actor each, every
  worker node held to a quarter of a core by a CFS quota so that three fit beside this
  machine's other load; the batches cross to the head node through Ray's object manager,
  over loopback. images/s, and CPU per image of the driver, the head node and the
  workers.

Prints one JSON document (machine, date, load averages before and after each run).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.convert_ray.rayhost import HOST, CPUGroup

DELAY = ("CoreWorkerService.grpc_client.PushTask=2000:2000,"
         "CoreWorkerService.grpc_server.PushTask=2000:2000")
QUOTA = 0.25  # scaling: each worker node may use a quarter of a core (CFS quota)


# ---- the clusters ---------------------------------------------------------------------------
class Cluster:
    """``ray start`` nodes on loopback, one cgroup each counting its processes' CPU;
    ``quota``: the worker nodes (all but the head) may use that share of one core, at most
    (a CFS quota), so that several fit beside a machine's other load."""

    def __init__(self, cpus_per_node: list[int], env: dict | None = None,
                 quota: float | None = None):
        self.tmp = tempfile.mkdtemp(prefix="dlrw")
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled",
                        **(env or {}))
        self.procs, self.groups, self.quotas, self.address = [], [], [], None
        try:
            for k, cpus in enumerate(cpus_per_node):
                self._node(k, cpus, quota if k else None)
        except BaseException:
            self.stop()
            raise

    def _node(self, k: int, cpus: int, quota: float | None) -> None:
        import socket

        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        group, limit = CPUGroup(f"dlrw-{k}"), Quota(f"dlrwq-{k}", quota)
        self.quotas.append(limit)
        args = ["--head", "--port", str(port), "--include-dashboard=false", "--temp-dir",
                self.tmp] if k == 0 else ["--address", self.address]
        log = Path(self.tmp, f"node{k}.log")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("ray")), "start", "--block",
                 "--node-ip-address", HOST, "--num-cpus", str(cpus), "--disable-usage-stats",
                 "--object-store-memory", str(400 * 2**20), *args], stdout=out,
                stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
                preexec_fn=lambda: (group.add(os.getpid()), limit.add(os.getpid())))
        self.procs.append(proc)
        self.groups.append(group)
        if k == 0:
            self.address = f"{HOST}:{port}"
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed:\n{log.read_text(errors='replace')}")
            time.sleep(0.1)

    def cgroups(self) -> list[str]:
        """The nodes' cgroup folders (None where cgroups are unavailable)."""
        return [g.path for g in self.groups]

    def stop(self) -> None:
        """SIGTERM every node (workers first), SIGKILL what is left after 60 s."""
        for proc in reversed(self.procs):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for group in self.groups + self.quotas:
            group.remove()
        shutil.rmtree(self.tmp, ignore_errors=True)  # Ray's session files and the logs


class Quota:
    """A cgroup (v1 ``cpu`` controller) whose processes share ``share`` of one core at
    most; does nothing for ``share=None`` or where it cannot be made (not root)."""

    def __init__(self, name: str, share: float | None):
        self.path = None
        root = "/sys/fs/cgroup/cpu"
        if share is None or not os.path.exists(os.path.join(root, "cpu.cfs_quota_us")):
            return
        path = os.path.join(root, f"{name}-{os.getpid()}")
        try:
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
                f.write("100000")
            with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
                f.write(str(int(share * 100000)))
        except OSError:
            return
        self.path = path

    def add(self, pid: int) -> None:
        """Limit ``pid`` (and what it starts from now on)."""
        if self.path:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
                f.write(str(pid))

    def remove(self) -> None:
        """Delete the group once its processes are gone."""
        deadline = time.monotonic() + 30
        while self.path and time.monotonic() < deadline:
            try:
                os.rmdir(self.path)
                return
            except OSError:  # processes still leaving
                time.sleep(0.1)


def _usage(path) -> float | None:
    if not path:
        return None
    for name in ("cpuacct.usage", "cpu.stat"):
        try:
            text = open(os.path.join(path, name)).read()
        except OSError:
            continue
        return int(text) / 1e9 if name == "cpuacct.usage" else \
            int(text.split("usage_usec")[1].split()[0]) / 1e6
    return None


# ---- one driver (a process of its own) -------------------------------------------------------
def drive(cfg: dict) -> dict:
    """Warm-up epoch, then timed epochs: wall, images, the driver's CPU, each node's."""
    import torch

    from dlpack_io.reader import (Dataset, Loader, Normalize, RandomHorizontalFlip,
                                  RandomResizedCrop, Workers)

    workers = Workers(kind=cfg["kind"], ray_options=cfg.get("ray_options"))
    loader = Loader(Dataset(cfg["data"]), batch_size=cfg["batch_size"], num_workers=cfg["n"],
                    transforms=[RandomResizedCrop(224), RandomHorizontalFlip(), Normalize()],
                    dtype=torch.float16, workers=workers)
    epochs = []
    with loader:
        for epoch in range(cfg["repeats"] + 1):
            nodes0, cpu0, t0 = [_usage(g) for g in cfg["cgroups"]], time.process_time(), \
                time.perf_counter()
            images = sum(len(labels) for _, labels in loader)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            nodes = [None if a is None else _usage(g) - a for g, a in zip(cfg["cgroups"], nodes0)]
            s = loader.stats()
            if epoch:  # epoch 0 warms up: actors start, pages are cached
                epochs.append({"wall_s": wall, "images": images, "driver_cpu_s": cpu,
                               "nodes_cpu_s": nodes, "moved_bytes": s.moved_bytes,
                               "stats_cpu_ms_per_image": s.cpu_ms_per_image,
                               "rebuilt": s.rebuilt})
    return {"epochs": epochs}


def run_driver(cfg: dict, env: dict | None = None) -> dict:
    """``drive(cfg)`` in a new process (with ``env`` added), with the load around it."""
    load0 = os.getloadavg()
    out = subprocess.run([sys.executable, "-m", "benchmarks.ray_workers", "--drive",
                          json.dumps(cfg)], capture_output=True, text=True,
                         env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0",
                                  RAY_AUTH_MODE="disabled", **(env or {})), timeout=1800)
    if out.returncode:
        raise RuntimeError(f"driver {cfg['name']} failed:\n{out.stderr[-4000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["load"] = [round(v, 2) for v in load0 + os.getloadavg()]
    return result


def summary(runs: list[dict]) -> dict:
    """Medians over every timed epoch of the runs: images/s, CPU-ms per image (driver,
    nodes, total), KB moved per image; the load averages seen."""
    epochs = [e for r in runs for e in r["epochs"]]

    def med(f):
        return round(statistics.median(f(e) for e in epochs), 3)
    nodes = len(epochs[0]["nodes_cpu_s"])
    out = {"images_per_s": med(lambda e: e["images"] / e["wall_s"]),
           "driver_cpu_ms_per_image": med(lambda e: 1e3 * e["driver_cpu_s"] / e["images"]),
           "kb_moved_per_image": med(lambda e: e["moved_bytes"] / e["images"] / 1e3),
           "stats_cpu_ms_per_image": med(lambda e: e["stats_cpu_ms_per_image"]),
           "rebuilt": sum(e["rebuilt"] for e in epochs), "epochs": len(epochs),
           "load_1min": [r["load"][0] for r in runs] + [runs[-1]["load"][3]]}
    if nodes and all(c is not None for e in epochs for c in e["nodes_cpu_s"]):
        for k in range(nodes):
            out[f"node{k}_cpu_ms_per_image"] = med(
                lambda e, k=k: 1e3 * e["nodes_cpu_s"][k] / e["images"])
        out["total_cpu_ms_per_image"] = med(
            lambda e: 1e3 * (e["driver_cpu_s"] + sum(e["nodes_cpu_s"])) / e["images"])
    else:
        out["total_cpu_ms_per_image"] = out["driver_cpu_ms_per_image"]
    return out


def main(argv=None) -> None:
    """Pack once, start the clusters, run the drivers round by round, print the JSON."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.ray_workers",
                                description=__doc__.splitlines()[0])
    p.add_argument("--root", default="/tmp/ray-workers")
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=4, help="rounds (each: 2 timed epochs)")
    p.add_argument("--out", default=None)
    p.add_argument("--drive", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.drive:
        print(json.dumps(drive(json.loads(a.drive))))
        return
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    root = Path(a.root)
    if not (root / "packed").exists():
        make_image_folder(root / "src", a.images, 10, seed=0)
        convert(root / "src", root / "packed", workers=1, progress=False, overwrite=True)
    base = {"data": str(root / "packed"), "batch_size": a.batch_size, "repeats": 2}
    results = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                          f"{platform.python_version()}",
               "date": datetime.date.today().isoformat(), "images": a.images,
               "batch_size": a.batch_size, "recipe": "RRC 224 + flip + Normalize, float16"}
    results.update(compare(a, base))
    results.update(scaling(a, base))
    text = json.dumps(results, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


def _ips(run: dict) -> float:
    return statistics.median(e["images"] / e["wall_s"] for e in run["epochs"])


def paired(slow: list[dict], plain: list[dict]) -> dict:
    """images/s of ``slow`` over ``plain`` run by run (same round, back to back, so the
    machine's other load drifts less between them): median, lowest, highest."""
    ratios = sorted(_ips(a) / _ips(b) for a, b in zip(slow, plain))
    return {"median": round(statistics.median(ratios), 3), "min": round(ratios[0], 3),
            "max": round(ratios[-1], 3), "rounds": len(ratios)}


def _idle_cores(cluster: Cluster, seconds: float = 10.0) -> float | None:
    """Cores an idle one-node cluster uses (raylet, GCS, agents): Ray's background cost."""
    u0, t0 = _usage(cluster.cgroups()[0]), time.perf_counter()
    time.sleep(seconds)
    u1 = _usage(cluster.cgroups()[0])
    return None if u0 is None else round((u1 - u0) / (time.perf_counter() - t0), 4)


def _memcpy() -> float:
    """This machine's memcpy bandwidth now (GB/s, a 19 MB copy, median of 20)."""
    import numpy as np

    src, times = np.ones(19 * 2**20, np.uint8), []
    dst = np.empty_like(src)
    for _ in range(20):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return round(src.nbytes / statistics.median(times) / 1e9, 2)


def compare(a, base: dict) -> dict:
    """threads, ray and ray + 2 ms (batch size as given, and 8), interleaved."""
    plain, slow = Cluster([2]), Cluster([2], env={"RAY_testing_asio_delay_us": DELAY})
    fast_env, slow_env = {"RAY_ADDRESS": plain.address}, \
        {"RAY_ADDRESS": slow.address, "RAY_testing_asio_delay_us": DELAY}
    ray = dict(base, kind="ray", n=2)
    contenders = [
        ("threads", dict(base, kind="thread", n=2, cgroups=[]), None),
        ("ray", dict(ray, cgroups=plain.cgroups()), fast_env),
        ("ray + 2 ms", dict(ray, cgroups=slow.cgroups()), slow_env),
        ("ray, batch 8", dict(ray, batch_size=8, cgroups=plain.cgroups()), fast_env),
        ("ray + 2 ms, batch 8", dict(ray, batch_size=8, cgroups=slow.cgroups()), slow_env)]
    runs, idle = {}, _idle_cores(plain)
    try:
        for _ in range(a.repeats):
            for name, cfg, env in contenders:
                print(f"  {name} ...", file=sys.stderr, flush=True)
                runs.setdefault(name, []).append(run_driver(dict(cfg, name=name), env))
    finally:
        plain.stop()
        slow.stop()
    rows = {name: summary(r) for name, r in runs.items()}
    t, r = rows["threads"], rows["ray"]
    return {"contenders": rows, "idle_cluster_cores": idle, "memcpy_gb_per_s": _memcpy(),
            "ratios": {
        "cpu_per_image_ray_over_threads": round(r["total_cpu_ms_per_image"] /
                                                t["total_cpu_ms_per_image"], 3),
        "images_per_s_2ms_over_none": paired(runs["ray + 2 ms"], runs["ray"]),
        "images_per_s_2ms_over_none_batch8": paired(runs["ray + 2 ms, batch 8"],
                                                    runs["ray, batch 8"])}}


def scaling(a, base: dict) -> dict:
    """A head node with no CPU for actors (the training node: the driver, the object store
    the batches land in) and k = 1, 2, 3 worker nodes of one actor each, every worker
    node held to a quarter of a core (QUOTA): images/s as CPUs are given."""
    rows = {}
    for k in (1, 2, 3):
        cluster = Cluster([0] + [1] * k, quota=QUOTA)
        try:
            cfg = dict(base, kind="ray", n=k, cgroups=cluster.cgroups(), name=f"{k} nodes")
            runs = []
            for _ in range(a.repeats):
                print(f"  {k} worker node(s) ...", file=sys.stderr, flush=True)
                runs.append(run_driver(cfg, {"RAY_ADDRESS": cluster.address}))
        finally:
            cluster.stop()
        row = summary(runs)
        row["worker_nodes_cpu_ms_per_image"] = round(sum(
            row[f"node{j}_cpu_ms_per_image"] for j in range(1, k + 1)), 3)
        rows[f"{k} worker node(s) x {QUOTA:g} core"] = row
    return {"scaling": rows}


if __name__ == "__main__":
    main()
