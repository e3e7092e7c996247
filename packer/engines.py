"""Which engine packs: worker processes on this machine (``packing.pack_local``), or tasks
on a Ray cluster (``--engine ray``, the rest of this module).

Ray's engine runs the local engine's plan as tasks. Shards are cut by encoded size, so a
task cannot simply be "one shard". The driver (this process) therefore works in two
phases, streamed:

1. ``encode_segment`` tasks encode fixed ranges of inputs (segments) in packing order; the
   payloads stay in Ray's object store, only sizes and outcomes come back to the driver.
2. The driver feeds those outcomes, in order, through the local engine's ``Packer``: the
   same reject handling and the same ShardCutter rule decide where each shard ends. Each
   planned shard becomes an ``assemble_shard`` task that writes it with the local writer
   (temp file, fsync, rename). Finished shards are journaled in shard order, and the
   driver writes the manifest last, exactly as the local engine does.

So the bytes do not depend on the engine, the cluster, segment sizes or task timing, and a
killed driver resumes from the journal like a local run. SRC must be a path every node
sees (a shared file system); DST too, or an ``s3://`` URL: each assembly task then uploads
its shard from a temporary folder of its own node (``upload``; the driver keeps the
journal in the bucket, as packer/upload.py does for the local engine). Ray itself is
imported only when a Ray engine is asked for.
"""
from __future__ import annotations

import contextlib
import faulthandler
import logging
import math
import os
import shutil
import socket
import tempfile
from collections import deque
from typing import NamedTuple

import numpy as np

from dlpack_io.packer.encode import encode_path
from dlpack_io.packer.options import PackOptions
from dlpack_io.packer.packing import (Packer, conversion_progress, encode_options, input_item,
                                      pack_local, packing_order)
from dlpack_io.packer.progress import Progress
from dlpack_io.packer.records import ConversionError, EncodedRecord
from dlpack_io.packer.writers import open_writer, partial_name
from dlpack_io.reader import format as fmt

log = logging.getLogger(__name__)
ENGINES = ("local", "ray")


def engine_context(engine: str, ray_address, opts: PackOptions):
    """A context manager that yields the function packing the inputs: worker processes
    here (local) or tasks on a Ray cluster. Raises at once for a bad choice or missing Ray."""
    if engine == "local":
        if ray_address is not None:
            raise ValueError("--ray-address is for --engine ray (the local engine uses this "
                             "machine's cores)")
        return contextlib.nullcontext(pack_local)
    if engine == "ray":
        return connection(ray_address, opts)
    raise ValueError(f"engine {engine!r}: expected one of {ENGINES}")


def segment_size(inputs: int, cpus: int, shard_size: int, mean_bytes: float) -> int:
    """Inputs per encode task; the output never depends on it.

    Small enough that every CPU gets at least 4 tasks (balance) and that a segment, whose
    payloads move as one object, spans few shards (each shard's task fetches whole
    segments); large enough that the driver, which spends ~0.6 ms on each task, keeps up
    with the cluster: 2 inputs per CPU, at least 64.
    """
    cap = min(max(64, 2 * cpus), int(shard_size // (4 * max(mean_bytes, 1.0))))
    return max(8, min(math.ceil(inputs / (4 * cpus)), cap))


def _segments(ray, files, options, cpus: int, size: int):
    """Yield (start, outcomes, payload ref) per segment in order, keeping 2 x ``cpus``
    encode tasks queued so no worker waits for the driver. ``files`` is a sequence of
    (path, size, mtime_ns) items, sliced lazily."""
    encode = ray.remote(encode_segment).options(
        num_returns=2, num_cpus=1, max_retries=MAX_RETRIES)
    enc_options = encode_options(options)
    starts = iter(range(0, len(files), size))
    queued: deque = deque()
    log.info("Ray: %d inputs in segments of %d on %d CPUs", len(files), size, cpus)
    try:
        while True:
            while len(queued) < 2 * cpus and (start := next(starts, None)) is not None:
                queued.append((start, *encode.remote(files[start:start + size], enc_options)))
            if not queued:
                return
            start, meta, blob = queued.popleft()
            span = f"{files[start][0]} .. {files[min(start + size, len(files)) - 1][0]}"
            yield start, task_result(ray, meta, f"encoding {span}"), blob
    finally:  # stopped early (an error, Ctrl-C): no encode task outlives the conversion
        settle_tasks(ray, [q[1] for q in queued], "encode tasks")


class _Items:
    """The encode items (path, size, mtime_ns) of inputs ``todo``, made per slice: a list
    of them all would hold ~250 bytes per input in the driver for the whole run."""

    def __init__(self, inputs, stats, todo):
        self.inputs, self.stats, self.todo = inputs, stats, todo

    def __len__(self) -> int:
        return len(self.todo)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return [input_item(self.inputs, self.stats, i) for i in self.todo[key]]
        return input_item(self.inputs, self.stats, self.todo[key])


def _feed(planner: RayPlanner, inputs, todo, base: int, segments, progress: Progress) -> None:
    """Hand every encode outcome to the planner in packing order (``base``: the position
    of ``todo[0]``), journaling finished shards between segments."""
    for start, outcomes, blob in segments:
        for k, outcome in enumerate(outcomes):
            i = todo[start + k]
            if outcome[0] != "ok":
                planner.reject(inputs.paths[i], outcome[1])
                progress.update(1, packed=False)
                continue
            record = PlannedRecord(blob, *outcome[1:])
            planner.add(inputs.paths[i], inputs.labels[i], record, base + start + k)
            progress.update(1, record.source_bytes)
        planner.poll()


def pack(dst, inputs, stats, options, state, journal_, *, ray, cpus: int,
         upload=None) -> Progress:
    """The Ray engine's counterpart of packing.pack_local: same arguments, same effect on
    ``state`` and the journal, same Progress. ``upload``: ``(url, storage_options)`` of
    an s3:// DST, which the tasks write to directly (``dst`` is then the driver's staging
    folder, unused; ``probe_nodes`` has checked that every node can write there)."""
    order = packing_order(len(inputs.paths), options)
    base = state.position
    todo = order[base:]
    mean_bytes = sum(stats[i][0] for i in todo) / max(len(todo), 1)
    size = segment_size(len(todo), cpus, options.shard_size, mean_bytes)
    progress = conversion_progress(dst, len(order), options, base)
    planner = RayPlanner(dst, inputs, options, state, journal_, ray=ray,
                         max_pending=max(2, cpus), upload=upload)
    try:
        # closed on the way out, before the handlers below: the queued encode tasks settle
        # first (a traceback would otherwise keep the generator, and them, alive)
        with contextlib.closing(_segments(ray, _Items(inputs, stats, todo), options, cpus,
                                          size)) as segments:
            _feed(planner, inputs, todo, base, segments, progress)
        planner.close(len(order))
        planner.drain()
    except ConversionError:
        planner.keep_completed()
        raise
    except OSError as exc:  # the journal, in the driver
        planner.abort()
        raise ConversionError(f"{dst}: cannot write shard ({exc}); completed shards are kept: "
                              f"fix the cause (free disk space?) and run again with "
                              f"--resume") from exc
    except BaseException:
        planner.abort()
        raise
    finally:
        progress.close()
    return progress


# ---- Ray engine, phase 2: the driver's Packer ------------------------------------------------
# Phase 2 of the Ray engine, in the driver: the local engine's Packer with shard writing
# replaced by ``assemble_shard`` tasks (below).
#
# The Packer's rule (packer/packing.py) decides where each shard ends from the sizes the
# encode tasks report; each planned shard becomes one task that writes it from slices of the
# segments' payload arrays, which never pass through the driver. Shards are journaled in
# shard order as their tasks finish, so a killed driver resumes like a local run.

ASSEMBLY_CPUS = 0.5   # shard writing is mostly I/O: let it overlap encoding


class PlannedRecord(NamedTuple):
    """An encoded record as the driver knows it: where its payload is, and its facts.

    The fields after ``blob`` are, in order, an ``"ok"`` outcome of
    encode_segment without its status: ``PlannedRecord(blob, *outcome[1:])``."""

    blob: object  # ObjectRef of the segment's payload array
    offset: int
    length: int
    crc: int
    height: int
    width: int
    kind: int
    orientation: int
    colour: int
    reencoded: str | None
    lossless: str | None
    source_bytes: int
    source_sha: str = ""


class RayPlanner(Packer):
    """The local packer with shard writing replaced by assembly tasks; shards are
    journaled in order as their tasks finish, at most ``max_pending`` in flight."""

    def __init__(self, dst, inputs, options, state, journal_, *, ray, max_pending: int,
                 upload=None):
        super().__init__(dst, inputs, options, state, journal_)
        self.ray, self.max_pending, self.upload = ray, max_pending, upload
        self.assemble = ray.remote(assemble_shard).options(
            num_cpus=ASSEMBLY_CPUS, max_retries=MAX_RETRIES)
        self.items, self.blobs = [], {}
        self.pending: deque = deque()  # (task ref, shard number, end_input, since)
        self.planned_shards, self.planned_samples = len(state.shards), state.next_sample

    def add(self, rel: str, label: int, record: PlannedRecord, position: int) -> None:
        """Plan one encoded record into the open shard (finishing the shard before it
        when the cut rule says so)."""
        if self.cutter.starts_new_shard(record.length):
            self.finish_shard(position)
        slot = self.blobs.setdefault(record.blob, len(self.blobs))
        # the item layout assemble_shard unpacks
        self.items.append((slot, record.offset, record.length, label, rel, record.crc,
                           record.height, record.width, record.kind, record.orientation,
                           record.colour, record.source_sha))
        self.count(label, record.reencoded, record.lossless)

    def has_open_shard(self) -> bool:
        """True while planned records wait for their shard's assembly task."""
        return bool(self.items)

    def finish_shard(self, end_input: int) -> None:
        """Submit the open shard's assembly task; wait for the oldest ones beyond
        ``max_pending`` (bounds the driver's memory and the cluster's queue)."""
        o = self.options
        ref = self.assemble.remote(self.dst, o.format, self.planned_shards, self.planned_samples,
                                   o.shard_size, self.items, *self.blobs, upload=self.upload)
        self.pending.append((ref, self.planned_shards, end_input, self.take_since()))
        self.planned_shards += 1
        self.planned_samples += len(self.items)
        self.items, self.blobs = [], {}
        while len(self.pending) > self.max_pending:
            self.commit_next()

    def commit_next(self) -> None:
        """Wait for the oldest assembly, then journal its shard."""
        ref, number, end_input, since = self.pending[0]
        entry = task_result(self.ray, ref, f"{self.dst}: cannot write shard {number}")
        self.pending.popleft()
        self.commit(entry, end_input, since)

    def poll(self) -> None:
        """Journal the shards whose tasks are done, in order, without waiting."""
        while self.pending and self.ray.wait([self.pending[0][0]], timeout=0)[0]:
            self.commit_next()

    def drain(self) -> None:
        """Wait for every planned shard and journal it."""
        while self.pending:
            self.commit_next()

    def abort(self) -> None:
        """Let the shards still being written finish, unjournaled (``--resume`` redoes
        them), so that no task of this conversion writes to DST after it returns."""
        settle_tasks(self.ray, [p[0] for p in self.pending], "shard writes")
        self.pending.clear()

    def keep_completed(self) -> None:
        """After a failure, journal the shards already written before it (as the local
        engine has them), then let the rest finish unjournaled."""
        try:
            self.drain()
        except ConversionError as exc:
            log.debug("after the first failure: %s", exc)
        finally:
            self.abort()


# ---- Ray engine: the tasks -------------------------------------------------------------------
# What the Ray engine's tasks run: plain functions of plain data (this module never
# imports ray, so they are tested, and can be debugged, without a cluster).
#
# Phase 1, ``encode_segment``: encode a fixed range of inputs exactly as the local engine's
# workers do (``encode.encode_path``) and return the per-input outcome (small, goes to the
# driver) and the payloads concatenated into one array (large, stays in Ray's object store).
# Phase 2, ``assemble_shard``: write one shard, planned by the driver with the local rule,
# from slices of those arrays through the local engine's own writer, which publishes it by
# rename. A retried attempt first removes what a killed attempt left.
PROBE_PREFIX = ".dlpack-probe-"  # name of the objects probe_store writes and deletes


def encode_segment(items: list, options: dict) -> tuple[list, np.ndarray]:
    """Encode ``items`` ((path, size, mtime_ns) each); return (outcomes, payloads).

    Outcome per input, in order: ``("ok", offset, length, crc, height, width, kind,
    orientation, colour, reencoded, lossless, source_bytes, source_sha)`` with the payload at
    ``payloads[offset:offset + length]``, or ``("reject", reason)`` with the local engine's
    reason.
    """
    outcomes, parts, offset = [], [], 0
    for item in items:
        status, value = encode_path(item, options)
        if status != "ok":
            outcomes.append((status, value))
            continue
        length = len(value.payload)
        outcomes.append(("ok", offset, length, value.crc, value.height, value.width,
                         value.kind, value.orientation, value.colour, value.reencoded,
                         value.lossless, value.source_bytes, value.source_sha))
        parts.append(value.payload)
        offset += length
    return outcomes, np.frombuffer(b"".join(parts), dtype=np.uint8)


def assemble_shard(dst, data_format: str, shard_number: int, first_sample: int,
                   shard_size: int, items: list, *payloads, upload=None) -> dict:
    """Write shard ``shard_number``; return its manifest entry (the local writer's).

    ``items`` are ``(array, offset, length, label, path, crc, height, width, kind,
    orientation, colour, source_sha)`` in shard order, ``array`` indexing ``payloads`` (encode_segment's
    arrays, which Ray hands over without copying). ``upload``: ``(url, storage_options)``
    of an s3:// DST; the shard is then written under a temporary folder here (``dst`` is
    not used) and uploaded, and the local copy removed.
    """
    if upload is None:
        return _write_shard(dst, data_format, shard_number, first_sample, shard_size, items,
                            payloads)
    from dlpack_io.packer.writers import upload_shard
    from dlpack_io.reader.remote.storage import Store

    url, storage_options = upload
    staging = tempfile.mkdtemp(prefix="dlpack-ray-shard-")
    try:
        entry = _write_shard(staging, data_format, shard_number, first_sample, shard_size,
                             items, payloads)
        upload_shard(Store(url, storage_options=storage_options), staging, entry)
        return entry
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def probe_store(url: str, storage_options: dict | None) -> str:
    """Write and delete a small object under ``url`` from this node; returns the node's
    host name. Raises StorageError when this node cannot write there."""
    from dlpack_io.reader.remote.storage import Store

    store = Store(url, storage_options=storage_options)
    name = f"{PROBE_PREFIX}{socket.gethostname()}-{os.getpid()}"
    store.put(name, b"dlpack: can this node write here?")
    store.delete(name)
    return socket.gethostname()


def _write_shard(dst, data_format, shard_number, first_sample, shard_size, items,
                 payloads) -> dict:
    stale = os.path.join(dst, partial_name(fmt.shard_name(shard_number, data_format)))
    try:  # a killed attempt's temp file: LMDB would reopen it instead of starting afresh
        os.unlink(stale)
    except FileNotFoundError:
        pass
    writer = open_writer(data_format, dst, shard_number, first_sample, shard_size)
    try:
        views = [memoryview(p) for p in payloads]
        for array, offset, length, label, path, crc, height, width, kind, orientation, \
                colour, *sha in items:  # sha: [the input's SHA-256], absent in older items
            record = EncodedRecord(views[array][offset:offset + length], height, width, kind,
                                   crc=crc, orientation=orientation, colour=colour,
                                   source_sha=sha[0] if sha else "")
            writer.add(record, label, path)
        return writer.finish()
    except BaseException:  # cancelled, disk full...: no temp file stays behind
        writer.abort()
        raise


# ---- Ray engine: the tasks' results ----------------------------------------------------------
# How the Ray engine's driver waits on its tasks: a task's result, or ConversionError
# naming the work and the fix; and, when a conversion stops, waiting for the tasks it no
# longer needs instead of cancelling them.
#
# Shared by the Ray encode phase and the Ray shard assembly, which submit their tasks
# with the same retry policy, ``MAX_RETRIES``.

MAX_RETRIES = 3       # attempts after a worker or node dies mid-task (Ray re-runs it)
SETTLE_SECONDS = 300  # the longest a stopped conversion waits for its submitted tasks


def settle_tasks(ray, refs: list, what: str) -> None:
    """Wait for tasks the conversion no longer needs instead of cancelling them.

    ``ray.cancel`` racing with a task that is just finishing aborts the driver inside Ray
    (RAY_CHECK "Tried to complete task that was not pending", ray-project/ray#54846): the
    load series of 2026-11-24 saw it once, in an ``--on-error fail`` conversion. The wait is
    short, a few tasks' time: at most 2 encode segments per CPU and one shard write per CPU
    are ever in flight. A second Ctrl-C leaves at once; a private cluster's shutdown then
    stops them."""
    if not refs:
        return
    log.info("stopping: waiting for %d %s already submitted to finish", len(refs), what)
    _, running = ray.wait(refs, num_returns=len(refs), timeout=SETTLE_SECONDS,
                          fetch_local=False)
    if running:
        log.warning("%d %s still running after %d s: left to the cluster", len(running),
                    what, SETTLE_SECONDS)


def task_result(ray, ref, doing: str):
    """``ray.get(ref)`` with Ray's failures turned into ConversionError naming the work."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:  # the task raised: OSError, MemoryError...
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        fix = "fix the cause (free disk space?) and " if isinstance(cause, OSError) else ""
        raise ConversionError(f"{doing} ({type(cause).__name__}: {cause}); completed shards "
                              f"are kept: {fix}run again with --resume") from None
    except ray.exceptions.RayError as exc:  # a worker or node died, again after the retries
        first_line = str(exc).strip().split("\n", 1)[0][:200]
        raise ConversionError(f"{doing}: Ray gave up after {MAX_RETRIES} retries "
                              f"({type(exc).__name__}: {first_line}); a worker or node was "
                              f"killed, ran out of memory or crashed in the image decoder; "
                              f"completed shards are kept, run again with --resume") from None


# ---- Ray engine: the cluster -----------------------------------------------------------------
# The Ray cluster a conversion runs on: importing Ray, reaching the cluster, connecting
# (or starting a private one) for the length of a conversion, and checking that every node
# can write to an s3:// DST.
#
# This part talks to Ray's process and network set-up; its failures are about the user's
# cluster rather than the data.

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

    probe = ray.remote(probe_store)
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
        if name.startswith(PROBE_PREFIX):
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
