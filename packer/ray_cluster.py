"""The Ray cluster a conversion runs on: importing Ray, reaching the cluster, connecting
(or starting a private one) for the length of a conversion, and checking that every node
can write to an s3:// DST.

Apart from ray_engine.py (what the driver does with the cluster once connected) because
this is the part that talks to Ray's process and network set-up, and the part whose
failures are about the user's cluster rather than the data.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import socket

from dlpack_io.packer import ray_tasks
from dlpack_io.packer.pipeline import ConversionError
from dlpack_io.packer.ray_engine import pack

log = logging.getLogger(__name__)

INSTALL = "pip install 'dlpack-io[ray]'"


def import_ray():
    """The ``ray`` module, or ConversionError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConversionError(f"--engine ray needs Ray, which is not installed ({exc}); "
                              f"install it with: {INSTALL}") from None
    return ray


def check_reachable(address) -> None:
    """Fail in seconds, naming the address, when nothing listens at a HOST:PORT address:
    Ray itself retries for minutes. ('auto', ray:// and no address are Ray's to resolve.)"""
    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConversionError(f"--ray-address {address!r}: expected HOST:PORT (the --port of "
                              f"`ray start --head`), 'auto' or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise ConversionError(f"cannot reach the Ray cluster at {address} "
                              f"({exc.strerror or exc}); start it with `ray start --head "
                              f"--port {port}` or fix --ray-address") from None


def probe_nodes(ray, url: str, storage_options: dict | None) -> None:
    """Fail before any work, naming the node, when a node of the cluster cannot write to
    ``url``: its tasks will upload shards there. Credentials are not sent over the cluster
    (only the explicit ``storage_options`` are): each node uses its own AWS_* variables,
    shared files or instance role, like any S3 client running there."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(ray_tasks.probe_store)
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")]
    refs = {n["NodeManagerAddress"]: probe.options(
        num_cpus=0, max_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
    ).remote(url, storage_options) for n in nodes}
    for address, ref in refs.items():
        try:
            ray.get(ref)
        except ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None) or exc
            first_line = str(cause).strip().split("\n", 1)[0][:300]
            raise ConversionError(
                f"the Ray node at {address} cannot write to {url} ({type(cause).__name__}: "
                f"{first_line}); the tasks upload the shards themselves, and credentials are "
                f"not sent over the cluster: give every node its AWS_* variables (or "
                f"~/.aws files, or an instance role) or pass storage_options explicitly"
            ) from None


def remove_probes(store) -> None:
    """Delete every probe object under the store's prefix, whichever run left it. A probe
    deletes its object itself, but a PUT attempt that timed out and was retried can still
    land on a loaded server after that delete (the load series of 2026-11-24 found one in a
    finished data set), and a run killed mid-probe leaves one: the run that uploads the
    manifest sweeps them."""
    for name in store.list():  # (S3 lists by folder: filter the names here)
        if name.startswith(ray_tasks.PROBE_PREFIX):
            store.delete(name)


class connection:  # noqa: N801  (used like a function: ``with connection(...) as pack``)
    """Connect to the cluster at ``address`` (None: start a private one on this machine
    with ``options.workers`` CPUs); entering yields a ``pack`` bound to it."""

    def __init__(self, address, options):
        self.ray = import_ray()
        if self.ray.is_initialized() and address not in (None, "auto"):
            raise ConversionError(f"this process is already connected to a Ray cluster; "
                                  f"leave out --ray-address {address} or disconnect")
        check_reachable(address)
        self.address, self.options = address, options
        self.connected_here = False
        self.faulthandler_was_on = faulthandler.is_enabled()

    def __enter__(self):
        ray = self.ray
        if not ray.is_initialized():  # else the caller's own connection: use it, leave it open
            self._init()
        try:
            cpus = int(ray.cluster_resources().get("CPU", 0))
            if cpus < 1:
                raise ConversionError("the Ray cluster has no CPUs to run tasks on; add a node "
                                      "with `ray start --address ... --num-cpus N`")
        except BaseException:
            self.__exit__()
            raise
        cpus = min(cpus, self.options.workers or cpus)
        log.info("Ray %s: %d nodes, %d CPUs used", ray.__version__, len(ray.nodes()), cpus)
        return lambda *args, **kwargs: pack(*args, ray=ray, cpus=cpus, **kwargs)

    def _init(self) -> None:
        kwargs = {"log_to_driver": False, "logging_level": logging.WARNING}
        if self.address is None and not os.environ.get("RAY_ADDRESS"):
            # A private cluster on this machine, gone with this process; no dashboard.
            kwargs.update(num_cpus=self.options.num_workers, include_dashboard=False)
        try:
            self.ray.init(address=self.address, **kwargs)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise ConversionError(f"cannot connect to the Ray cluster at {self.address}: "
                                  f"{exc}; start it with `ray start --head` or fix "
                                  f"--ray-address") from None
        self.connected_here = True

    def __exit__(self, *exc_info) -> None:
        if self.connected_here:
            self.ray.shutdown()  # a private cluster stops; a shared one only loses this driver
            if self.faulthandler_was_on:
                # ray.init replaced the SIGSEGV handler and shutdown left none: give the
                # caller's faulthandler back, or a later crash would say nothing (enable()
                # alone does nothing while faulthandler believes it is still installed)
                faulthandler.disable()
                faulthandler.enable()
