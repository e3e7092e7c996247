"""Ray workers (``Workers(kind="ray")``): batches built by Ray actors on a cluster's CPUs.

``num_workers`` actors, placed by Ray on the cluster that ``ray.init`` finds (``ray_address``,
else ``RAY_ADDRESS``, else a local one started for this process), each open the data set
themselves (``Dataset.open_args``: a path visible to them, or s3:// / gs:// / az:// fetched
into their own node's cache) and run the build job of worker processes (build.py
``FinishedJob``, or gather.py ``GatherJob`` for transforms on the device): ``build`` into a
slot of their own, whose filled bytes come back through Ray's object store, where the
consumer's ``collect`` takes them as it takes a process worker's slot. A batch is a pure
function of (seed, epoch, its sample indices), so which actor builds it, or builds it again,
changes nothing in it.

Faults. An actor that dies, or whose node dies, costs only the batches it held: they go to
the actors still alive, are built again, identical, and a new actor is started in its place
(it takes work once it answers). A batch whose actor was lost while building it
MAX_ATTEMPTS times is the cause rather than a victim: WorkerError naming it. A cluster that
cannot be reached, has fewer CPUs than the actors need, or none free for them within the
start timeout is a RayClusterError naming the address.

The runner protocol is workers.py's (submit / can_submit / ready / get / close / pids).
Ray is imported here only, and only for kind="ray"; this connection to the cluster stays
open for the life of the process (Ray cannot connect again after ``ray.shutdown`` in one
process), the actors go with ``close``.
"""
from __future__ import annotations

import io
import logging
import os
import pickle
import socket
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from dlpack_io.reader.batch.errors import LoaderTimeout, WorkerError

log = logging.getLogger(__name__)
INSTALL = "pip install 'dlpack-io[ray]'"
START_TIMEOUT_S = 60.0  # actors not answering by then (without a timeout): the cluster is full
MAX_ATTEMPTS = 3        # actors lost while building one batch before it is named the cause
POLL_S = 1.0            # longest single wait (the consumer checks starting actors between)


class RayClusterError(WorkerError):
    """The Ray cluster cannot be reached, or cannot host the loader's actors."""


# ---- the cluster --------------------------------------------------------------------------
def import_ray():
    """The ``ray`` module, or ImportError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"Workers(kind='ray') needs Ray, which is not installed ({exc}); "
                          f"install it with: {INSTALL}") from None
    return ray


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().split("\n", 1)[0]
    return f"{type(exc).__name__}: {text[:300]}"


def _endpoint(address: str):
    host, _, port = address.rpartition(":")
    try:
        return socket.gethostbyname(host.strip("[]")), port
    except OSError:
        return host, port


def check_reachable(address) -> None:
    """Fail in seconds, naming the address, when nothing listens at a HOST:PORT address
    (Ray itself retries for minutes). 'auto', ray:// and no address are Ray's to resolve."""
    if not address or address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise RayClusterError(f"Ray address {address!r}: expected HOST:PORT (the --port of "
                              f"`ray start --head`), 'auto' or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise RayClusterError(f"cannot reach the Ray cluster at {address} "
                              f"({exc.strerror or exc}); start it with `ray start --head "
                              f"--port {port}`, or fix Workers(ray_address=...) / "
                              f"RAY_ADDRESS") from None


def connect(ray, address: str | None) -> str:
    """Connect this process to the cluster at ``address`` (None: RAY_ADDRESS, else a new
    local cluster), or use the connection already open; returns the cluster's address."""
    if ray.is_initialized():
        here = ray.get_runtime_context().gcs_address
        if address not in (None, "auto") and "://" not in address and \
                _endpoint(address) != _endpoint(here):
            raise RayClusterError(f"this process is already connected to the Ray cluster at "
                                  f"{here}, not {address}: leave out ray_address (the open "
                                  f"connection is used) or call ray.shutdown() first")
        return here
    asked = address or os.environ.get("RAY_ADDRESS")
    check_reachable(asked)
    kwargs = {"log_to_driver": False, "logging_level": logging.WARNING}
    if not asked:  # a local cluster for this process, gone with it
        kwargs["include_dashboard"] = False
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise RayClusterError(f"cannot connect to the Ray cluster at {asked or 'a new local'} "
                              f"({_first_line(exc)}); start it with `ray start --head`, or fix "
                              f"Workers(ray_address=...) / RAY_ADDRESS") from None
    return ray.get_runtime_context().gcs_address


def check_cpus(ray, address: str, actors: int, cpus: float) -> None:
    """Refuse at once a cluster that could never host ``actors`` actors of ``cpus`` CPUs."""
    total = float(ray.cluster_resources().get("CPU", 0))
    if total < actors * cpus:
        raise RayClusterError(
            f"the Ray cluster at {address} has {total:g} CPUs; {actors} loader actors of "
            f"{cpus:g} CPU need {actors * cpus:g}: lower num_workers, or add a node "
            f"(`ray start --address {address} --num-cpus N`)")


def _open_dataset(args: dict):
    """In an actor: the data set, opened by this process (Dataset.open_args)."""
    from dlpack_io.reader.dataset import Dataset

    return Dataset(**args)


def dumps_for_actors(obj) -> bytes:
    """``obj`` pickled for the actors: with cloudpickle (a sample_transform defined in the
    training script travels by value), each Dataset in it as its ``open_args``, so that an
    actor opens the data set itself instead of attaching to this process's cache."""
    from ray import cloudpickle

    from dlpack_io.reader.dataset import Dataset

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, o):
            if type(o) is Dataset:
                return _open_dataset, (o.open_args(),)
            return super().reducer_override(o)

    out = io.BytesIO()
    Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return out.getvalue()


# ---- the actor ------------------------------------------------------------------------------
class BatchActor:
    """One Ray actor (``ray.remote(BatchActor)``): builds one batch at a time with the job,
    into a slot of its own, and returns the slot's filled bytes."""

    def __init__(self, job_blob: bytes, slot_bytes: int):
        import torch

        torch.set_num_threads(1)  # the epilogue's torch ops: one thread, as a worker process
        self.error = None
        try:
            self.job = pickle.loads(job_blob)()  # opens the data set (its indexes) here
        except Exception as exc:  # reported by ready(), with this node's address
            self.error = exc
        self.slot = np.empty(max(1, int(slot_bytes)), dtype=np.uint8)
        self.state, self.progress = {}, np.full(1, -1, dtype=np.int64)
        self.cpu = time.process_time()

    def ready(self) -> dict:
        """Where this actor runs; raises what went wrong while it set up."""
        import ray

        ip = ray.util.get_node_ip_address()
        if self.error is not None:
            raise RuntimeError(f"on node {ip} (pid {os.getpid()}): "
                               f"{_first_line(self.error)}") from self.error
        return {"pid": os.getpid(), "ip": ip, "node": ray.get_runtime_context().get_node_id()}

    def build(self, indices, epoch: int):
        """(pickled metadata, the slot's filled bytes, {"cpu": seconds}) of one batch (the
        metadata pickled here: its arrays then arrive writable, not as read-only views of
        the object store). A data set in object storage: the batch's records are fetched
        first (one coalesced plan per batch)."""
        prefetch = self.job.ctx.dataset.start_prefetch([indices])
        try:
            if prefetch is not None:
                prefetch.wait(0)
            meta = self.job.build(self.slot, self.progress, self.state, indices, epoch)
        finally:
            if prefetch is not None:
                prefetch.close()
        now = time.process_time()  # since the last batch: this one, and Ray storing that one
        cpu, self.cpu = now - self.cpu, now
        return pickle.dumps(meta, protocol=pickle.HIGHEST_PROTOCOL), \
            self.slot[:self.job.used_bytes(meta)], {"cpu": cpu}


# ---- the runner -----------------------------------------------------------------------------
@dataclass(eq=False)
class _Actor:
    """One actor as the runner sees it: its handle, whether it answered, its batches."""

    number: int
    handle: object
    ping: object                               # ready()'s reference until it answered
    info: dict = field(default_factory=dict)   # pid, ip, node once it answered
    tickets: list = field(default_factory=list)  # batches sent to it, in order
    alive: bool = True

    def name(self) -> str:
        """'Ray loader actor 3 (pid 4242 on 10.0.0.7)', for messages."""
        where = f" (pid {self.info['pid']} on {self.info['ip']})" if self.info else ""
        return f"Ray loader actor {self.number}{where}"


@dataclass(eq=False)
class _Task:
    """One submitted batch: what to build, where it was sent, what came back."""

    indices: object
    epoch: int
    actor: _Actor
    ref: object
    attempts: int = 1       # actors that were building it when lost, plus one
    resent: int = 0         # times it went to another actor (its actor was lost)
    value: tuple = None     # (meta, bytes, info) once arrived
    error: BaseException = None
    taken_s: float = 0.0    # seconds spent taking it from the object store


class RayRunner:
    """``num_workers`` Ray actors running the job's ``build``; ``job.collect`` runs here on
    each result (``remote_job``: a picklable factory of the job the actors run)."""

    in_process = False  # built elsewhere
    opens_data = True   # the actors open the data set: no prefetch in this process
    pids: list = []     # nothing here to read from /proc: the actors report their CPU

    def __init__(self, job, remote_job, num_workers: int, slot_bytes: int, slots: int, *,
                 address: str | None = None, actor_options: dict | None = None,
                 timeout: float | None = None, describe=None):
        self.ray = ray = import_ray()
        self.address = connect(ray, address)
        self._job, self._timeout, self._slots = job, timeout, max(1, int(slots))
        self._describe = describe or (lambda sample: f"sample {sample}")
        options = dict(actor_options or {})
        self._cpus = float(options.pop("num_cpus", 1))
        check_cpus(ray, self.address, num_workers, self._cpus)
        try:
            self._cls = ray.remote(BatchActor).options(
                num_cpus=self._cpus, max_restarts=0, max_concurrency=1, **options)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Workers(ray_options={actor_options!r}): Ray refuses them "
                             f"({_first_line(exc)})") from None
        self._blob, self._slot_bytes = dumps_for_actors(remote_job), int(slot_bytes)
        self._actors, self._tasks, self._held = [], {}, 0
        self.lost, self._failed_starts, self._wanted = 0, 0, int(num_workers)
        for _ in range(num_workers):
            self._start_actor()
        try:
            self._await(lambda: not any(a.ping is not None for a in self._live(False)),
                        "all started")
        except BaseException:
            self.close()
            raise

    # ---- actors ------------------------------------------------------------------------
    def _start_actor(self) -> None:
        handle = self._cls.remote(self._blob, self._slot_bytes)
        self._actors.append(_Actor(len(self._actors), handle, handle.ready.remote()))

    def _live(self, answered: bool = True) -> list:
        return [a for a in self._actors if a.alive and (a.ping is None or not answered)]

    def _check_started(self, wait: float = 0.0) -> None:
        """Take the answers of starting actors (waiting up to ``wait`` s for them all)."""
        pending = {a.ping: a for a in self._live(False) if a.ping is not None}
        if not pending:
            return
        done, _ = self.ray.wait(list(pending), num_returns=len(pending), timeout=wait)
        for ref in done:
            actor = pending[ref]
            try:
                actor.info, actor.ping = self.ray.get(ref), None
            except self.ray.exceptions.RayTaskError as exc:  # its set-up raised
                self.close()
                raise WorkerError(
                    f"Ray loader actor {actor.number} could not set up {_cause(exc)}; the "
                    f"actors open the data set themselves: its path must be visible on "
                    f"every node (a shared file system), or read it from s3://, gs:// or "
                    f"az://, and a sample_transform must be importable there (or defined "
                    f"in the training script)") from None
            except _losses(self.ray) as exc:
                self._failed_starts += 1
                if self._failed_starts > MAX_ATTEMPTS * self._wanted:
                    self.close()
                    raise RayClusterError(f"Ray loader actors keep dying as they start on the "
                                          f"cluster at {self.address}, the last: "
                                          f"{_first_line(exc)}") from None
                self._lost(actor, exc)

    def _await(self, done, what: str) -> None:
        """Wait until ``done()`` (actors answering), at most the start timeout."""
        limit = self._timeout or START_TIMEOUT_S
        deadline = time.monotonic() + limit
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._no_room(limit, what)
            self._check_started(min(left, POLL_S))

    def _no_room(self, limit: float, what: str) -> RayClusterError:
        started = len(self._live())
        total = float(self.ray.cluster_resources().get("CPU", 0))
        free = float(self.ray.available_resources().get("CPU", 0))
        self.close()
        return RayClusterError(
            f"Ray loader actors not {what} within {limit:g} s on the Ray cluster at "
            f"{self.address} ({started} of {self._wanted} answering; the cluster reports "
            f"{free:g} of its {total:g} CPUs free, each actor needs {self._cpus:g}): no CPUs "
            f"free for them (other jobs' tasks and actors hold them: free some, lower "
            f"num_workers, or add a node with `ray start --address {self.address}`), or "
            f"actors slow to start (importing torch on a busy node: give them longer with "
            f"Workers(timeout=...))")

    def _pick(self) -> _Actor:
        """The answering actor with the fewest batches queued (waits for one to answer
        when none does, e.g. all were lost and their replacements are starting)."""
        self._check_started()
        if not self._live():
            self._await(lambda: bool(self._live()), "answering after the others were lost")
        return min(self._live(), key=lambda a: (len(a.tickets), a.number))

    def _send(self, ticket: int, task: _Task) -> None:
        actor = self._pick()
        task.actor, task.value = actor, None
        task.ref = actor.handle.build.remote(task.indices, task.epoch)
        actor.tickets.append(ticket)

    def _lost(self, actor: _Actor, exc: BaseException) -> None:
        """``actor`` (or its node) is gone: its batches go to the others, a new one starts."""
        if not actor.alive:
            return
        actor.alive, self.lost = False, self.lost + 1
        try:
            self.ray.kill(actor.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass
        tickets, actor.tickets = actor.tickets, []
        log.warning("%s was lost (%s): its %d batches are built again by the other actors; "
                    "a new actor starts in its place", actor.name(), _first_line(exc),
                    len(tickets))
        self._start_actor()
        for i, ticket in enumerate(tickets):
            task = self._tasks[ticket]
            task.attempts += i == 0  # the first was being built; the others only queued
            if task.attempts > MAX_ATTEMPTS:
                task.error = WorkerError(
                    f"batch {ticket} ({len(task.indices)} samples from "
                    f"{self._describe(int(task.indices[0]))}) lost {MAX_ATTEMPTS} Ray loader "
                    f"actors while they built it, the last {actor.name()}: "
                    f"{_first_line(exc)}; a sample that crashes the decoder, or actors out "
                    f"of memory (lower batch_size, or give them more with ray_options)")
                task.ref = None
                continue
            task.resent += 1
            self._send(ticket, task)

    # ---- the protocol ------------------------------------------------------------------
    def submit(self, ticket: int, indices, epoch: int) -> None:
        """Send the batch to the answering actor with the fewest batches queued."""
        task = _Task(np.asarray(indices), int(epoch), None, None)
        self._tasks[ticket] = task
        self._send(ticket, task)

    def can_submit(self) -> bool:
        """True while fewer than ``slots`` batches are out (queued, or held by the finish)."""
        return len(self._tasks) + self._held < self._slots

    def ready(self, ticket: int) -> bool:
        """True when the batch arrived (or failed for good); a batch whose actor was lost
        is sent to another and is not ready."""
        task = self._tasks.get(ticket)
        if task is None or task.value is not None or task.error is not None:
            return task is not None
        done, _ = self.ray.wait([task.ref], timeout=0, fetch_local=True)
        if done:
            self._take(ticket, task)
        return task.value is not None or task.error is not None

    def _take(self, ticket: int, task: _Task) -> None:
        t0 = time.perf_counter()
        try:
            task.value = self.ray.get(task.ref)
        except self.ray.exceptions.RayTaskError as exc:  # building it raised (SampleError)
            task.error = _unwrap(exc)
        except _losses(self.ray) as exc:
            lost = task.ref
            self._lost(task.actor, exc)
            if task.ref is lost:  # its actor was already known lost, yet it is still here
                task.resent += 1
                self._send(ticket, task)
        task.taken_s += time.perf_counter() - t0
        if task.value is not None or task.error is not None:
            if ticket in task.actor.tickets:
                task.actor.tickets.remove(ticket)

    def get(self, ticket: int):
        """Wait for the batch (rebuilt elsewhere if its actor is lost); return
        ``job.collect(...)`` or raise what building it raised, or LoaderTimeout."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while not self.ready(ticket):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                self._time_out(ticket)
            task = self._tasks[ticket]
            self.ray.wait([task.ref], timeout=POLL_S if left is None else min(left, POLL_S),
                          fetch_local=True)
            self._check_started()
        task = self._tasks.pop(ticket)
        if task.error is not None:
            raise task.error
        return self._collect(task)

    def _collect(self, task: _Task):
        t0 = time.perf_counter()
        meta, data, info = task.value
        meta = pickle.loads(meta)
        task.value, self._held = None, self._held + 1
        released = []

        def release() -> None:  # the batch's bytes may leave the object store
            if not released:
                released.append(True)
                self._held -= 1
        with warnings.catch_warnings():  # Ray's buffers are read-only; nothing writes them
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            hb = self._job.collect(data, meta, release)
        hb.remote = {"remote_cpu_s": float(info["cpu"]), "moved_bytes": int(data.nbytes),
                     "transfer_s": task.taken_s + time.perf_counter() - t0,
                     "rebuilt": int(task.resent > 0)}
        return hb

    def _time_out(self, ticket: int) -> None:
        task = self._tasks[ticket]
        self.close()
        raise LoaderTimeout(f"batch {ticket} (sent to {task.actor.name()}) not built after "
                            f"timeout={self._timeout:g} s on the Ray cluster at "
                            f"{self.address}; the loader's actors were stopped (a stuck read, "
                            f"a sample_transform that never returns, or no free CPU?)")

    def actors(self) -> list[dict]:
        """Where each answering actor runs: {"number", "pid", "ip", "node"} (for tests)."""
        return [dict(a.info, number=a.number) for a in self._live()]

    def close(self) -> None:
        """Stop the actors (Ray frees their CPUs); drop unclaimed results. Idempotent; the
        connection to the cluster stays open."""
        for actor in self._actors:
            if actor.alive:
                actor.alive = False
                try:
                    self.ray.kill(actor.handle, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone, or Ray shut down
                    pass
        self._actors, self._tasks = [], {}


def _losses(ray) -> tuple:
    """Ray's exceptions for an actor, node or result that is gone (the batch is not at
    fault: it is built again elsewhere)."""
    ex = ray.exceptions
    return tuple(getattr(ex, name) for name in ("RayActorError", "ObjectLostError",
                                                "WorkerCrashedError", "NodeDiedError")
                 if hasattr(ex, name))


def _unwrap(exc) -> BaseException:
    """What a build raised in the actor (a SampleError, say), chained to Ray's error that
    carries the actor's traceback."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        cause.__cause__ = exc
        return cause
    return exc


def _cause(exc) -> str:
    cause = getattr(exc, "cause", None) or exc
    return str(cause).strip().split("\n", 1)[0][:400]
