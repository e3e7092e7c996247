"""What both engines share: the packing order, the state of a conversion, the Packer that
cuts encoded inputs into shards (one rule, ``ShardCutter``) and journals them, the local
engine's ordered parallel encode (``pack_local``), and the inputs' scan and plan (the manifest and summary at
the end are finalize.py's).

The local engine (``pack_local``: worker processes on this machine) and the Ray engine
(engines.py) both drive a Packer, which is why their outputs are byte-identical;
conversion.py chooses the engine and owns DST (lock, resume, manifest).
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
import multiprocessing
import os
import signal
from collections import Counter, deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field

import numpy as np

from dlpack_io.packer import fields as fields_mod
from dlpack_io.packer import journal
from dlpack_io.packer.containers import SOURCE_OPTIONS, detect, scan_container
from dlpack_io.packer.encode import encode_path, read_span, require_pil
from dlpack_io.packer.fields import field_source, fields_ahead, with_fields
from dlpack_io.packer.jsonlist import read_list
from dlpack_io.packer.options import PackOptions
from dlpack_io.packer.progress import Progress
from dlpack_io.packer.records import BAD_INPUT, ConversionError
from dlpack_io.packer.scan import link_counts, scan_image_folder, shown, stat_inputs
from dlpack_io.packer.writers import open_writer
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.checks import NotRegularFile, open_input
from dlpack_io.reader.format.spec import parse_size

log = logging.getLogger(__name__)


@dataclass
class State:
    """Where packing stands: shards done, the next input position, rejects pending."""

    position: int = 0
    shards: list = field(default_factory=list)
    rejects: list = field(default_factory=list)
    reencoded: Counter = field(default_factory=Counter)
    lossless: Counter = field(default_factory=Counter)
    class_counts: np.ndarray | None = None
    shapes: dict | None = field(default_factory=dict)  # array field -> shared shape (fields.py)

    @property
    def next_sample(self) -> int:
        """Global index of the next sample packed: the samples of the shards done."""
        return sum(s["num_samples"] for s in self.shards)

    def take_over(self, entry: dict) -> None:
        """Count a shard that an interrupted run journaled (and that is kept) as done."""
        self.shards.append(entry["shard"])
        self.position = entry["end_input"]
        self.rejects += [tuple(r) for r in entry["rejects"]]
        self.reencoded.update(entry["reencoded"])
        self.lossless.update(entry.get("lossless", {}))
        self.shapes = fields_mod.merge_shapes(self.shapes,
                                              fields_mod.journaled_shapes(entry.get("shapes")))
        self.class_counts += np.asarray(entry["class_counts"], dtype=np.int64)


def packing_order(n: int, options: PackOptions) -> np.ndarray:
    """Input positions in packing order: a seeded permutation, or the scan order."""
    if options.shuffle:
        return np.random.default_rng(options.seed).permutation(n)
    return np.arange(n)


class Packer:
    """Consumes encoded inputs in order and cuts them into shards (ShardCutter's rule).

    The Ray engine subclasses it to plan shards instead of writing them; rejects, counts
    and the journal are kept here for both engines.
    """

    def __init__(self, dst, inputs, options: PackOptions, state: State, journal_: journal.Journal):
        self.dst, self.inputs, self.options, self.state = dst, inputs, options, state
        self.journal = journal_
        self.writer = None
        self.cutter = ShardCutter(options.format, options.shard_size)
        self.since = State(class_counts=np.zeros(len(inputs.classes), dtype=np.int64))
        targets = getattr(getattr(inputs, "targets", None), "schema", None) or ()
        self.arrays = fields_mod.array_names(getattr(inputs, "fields", None), skip=targets)

    def reject(self, rel: str, reason: str) -> None:
        """Record an input that cannot be packed (or stop, with ``--on-error fail``)."""
        if self.options.on_error == "fail":
            raise ConversionError(f"{os.path.join(self.inputs.root, rel)}: {reason} "
                                  f"(--on-error fail stops at the first bad input)")
        log.debug("skipping %s: %s", shown(rel), shown(reason))
        self.since.rejects.append((shown(rel), shown(reason)))  # escaped: JSON/TSV-safe

    def add(self, rel: str, label: int, record, position: int, fields=None) -> None:
        """Write one EncodedRecord (input ``position`` in packing order) and its field
        block into the open shard, first finishing the shard before it when the cut rule
        says so."""
        if self.cutter.starts_new_shard(len(record.payload) + len(fields or b"")):
            self.finish_shard(position)
        if self.writer is None:
            self.writer = open_writer(self.options.format, self.dst, len(self.state.shards),
                                      self.state.next_sample, self.options.shard_size)
        if fields is None:  # the writers' original call (tests wrap it with this signature)
            self.writer.add(record, label, rel)
        else:
            self.writer.add(record, label, rel, fields)
        self.count(label, record.reencoded, record.lossless)
        if self.arrays and fields is not None:
            fields_mod.merge_shapes(self.since.shapes,
                              fields_mod.block_shapes(fields, self.inputs.fields, self.arrays))

    def count(self, label: int, reencoded: str | None, lossless: str | None) -> None:
        """Account one packed record in the open shard's class, re-encode and lossless
        counts (label -1: packed without labels, no class to count)."""
        if label >= 0:
            self.since.class_counts[label] += 1
        if reencoded:
            self.since.reencoded[reencoded] += 1
        if lossless:
            self.since.lossless[lossless] += 1

    def finish_shard(self, end_input: int) -> None:
        """Publish the open shard and journal it; ``end_input`` is where a resume goes on."""
        entry = self.writer.finish()
        self.writer = None
        self.commit(entry, end_input, self.take_since())

    def take_since(self) -> State:
        """Hand over the open shard's rejects and counts; start afresh for the next one."""
        since = self.since
        self.since = State(class_counts=np.zeros_like(since.class_counts))
        return since

    def commit(self, entry: dict, end_input: int, since: State) -> None:
        """Journal a published shard, then count it as done (shards in order)."""
        self.journal.append({"shard": entry, "end_input": end_input, "rejects": since.rejects,
                             "reencoded": dict(since.reencoded), "lossless": dict(since.lossless),
                             "class_counts": since.class_counts.tolist(), "shapes": since.shapes})
        st = self.state
        st.shards.append(entry)
        st.rejects += since.rejects
        st.reencoded.update(since.reencoded)
        st.lossless.update(since.lossless)
        st.class_counts += since.class_counts
        st.shapes = fields_mod.merge_shapes(st.shapes, since.shapes)

    def has_open_shard(self) -> bool:
        """True while records wait to be written into a shard."""
        return self.writer is not None

    def close(self, end_input: int) -> None:
        """After the last input: finish the open shard, keep the trailing rejects."""
        if self.has_open_shard():
            self.finish_shard(end_input)
        self.state.rejects += self.since.rejects  # trailing rejects after the last record

    def abort(self) -> None:
        """Drop the unfinished shard (its temp file); finished shards stay journaled."""
        if self.writer is not None:
            self.writer.abort()
            self.writer = None


def _fetch_passthrough(record, item: tuple):
    """Give a passthrough record its bytes back by re-reading the file (or its span of a
    container); the CRC computed by the worker proves they are the bytes it validated.
    Returns None if they are not."""
    if record.payload is not None:
        return record
    try:
        data = read_span(item)  # swapped for a FIFO since: not the file validated
    except OSError:
        return None
    if fmt.crc32(data) != record.crc:
        return None
    return dataclasses.replace(record, payload=data)


def encode_options(options: PackOptions) -> dict:
    """The keyword arguments of encode.encode_file that ``options`` stand for (plain data:
    they travel to worker processes and Ray tasks)."""
    return {"mode": options.mode, "size": options.size, "max_side": options.max_side,
            "quality": options.quality, "validate": options.validate,
            "restarts": options.jpeg_restarts, "non_jpeg": options.non_jpeg,
            "max_pixels": options.max_pixels}


def input_item(inputs, stats, i: int) -> tuple:
    """The encode item of input ``i``: (absolute path, size, mtime_ns) as scanned, what
    encode.encode_path reads and checks (both engines build their items here)."""
    if inputs.bad and i in inputs.bad:  # known to be a reject: encode_path says why
        return (os.path.join(inputs.root, inputs.paths[i]), BAD_INPUT, inputs.bad[i])
    if inputs.members is not None:  # inside a tar, Parquet, ... file: containers.py
        return inputs.members.item(inputs.paths[i])
    return (os.path.join(inputs.root, inputs.paths[i]), *stats[i])


def conversion_progress(dst, total: int, options: PackOptions, done: int) -> Progress:
    """The progress display of a conversion into ``dst``, ``done`` of ``total`` inputs
    already packed by an interrupted run (the same for both engines)."""
    return Progress(total, f"convert {os.path.basename(dst)}", enabled=options.progress,
                    initial=done)


def pack_local(dst, inputs, stats, options: PackOptions, state: State, journal_) -> Progress:
    """The local engine: encode in worker processes on this machine (packing.py), in
    packing order from ``state.position``, and cut and journal shards with a Packer."""
    order = packing_order(len(inputs.paths), options)
    todo = order[state.position:]
    files = [input_item(inputs, stats, i) for i in todo]
    progress = conversion_progress(dst, len(order), options, state.position)
    packer = Packer(dst, inputs, options, state, journal_)
    source, block = field_source(inputs), None
    fields = fields_ahead(source, todo, min(4, options.num_workers)) \
        if source is not None else None  # made ahead, in threads: packer/fields.py
    try:
        results = encode_in_order(files, encode_options(options), options.num_workers)
        for position, i, (status, value) in zip(range(state.position, len(order)), todo, results):
            rel = inputs.paths[i]
            if source is not None:  # a bad field (or list line) is the reason given
                field_status, block = next(fields)
                status, value = (status, value) if field_status == "ok" else ("reject", block)
            if status == "ok":
                value = _fetch_passthrough(value, files[position - state.position])
                if value is None:
                    status, value = "reject", "file changed while packing (content differs " \
                                              "from what was validated); re-run to pack it"
            if status == "reject":
                packer.reject(rel, value)
                progress.update(1, packed=False)
                continue
            packer.add(rel, inputs.labels[i], value, position, block)
            progress.update(1, value.source_bytes)
        packer.close(len(order))
    except OSError as exc:
        packer.abort()
        raise ConversionError(f"{dst}: cannot write shard ({exc}); free disk space?") from exc
    except BaseException:
        packer.abort()
        raise
    finally:
        progress.close()
    return progress


def _scan(src, list_file, labels: bool, source: dict):
    kind = None if list_file else detect(src, source.get("source_format"))
    if kind is not None:  # samples inside tars, Parquet, TFRecord or RecordIO files
        return scan_container(src, kind, labels, source)
    if list_file and not labels:
        raise ValueError("--no-labels packs a folder without classes; a --list gives labels: "
                         "use one or the other")
    if list_file:  # a FIFO or a device would block or never end: refused before reading
        try:
            os.close(open_input(list_file)[0])
        except NotRegularFile as exc:
            raise ValueError(f"--list {list_file}: {exc.strerror}; write the list to a file")\
                from None
    inputs = read_list(src, list_file) if list_file else scan_image_folder(src, labels=labels)
    for name, others in inputs.empty_classes:
        log.warning("class folder %s has no usable image (%d other files, none an image, "
                    "or a folder already packed through a symlink): class %r will have 0 "
                    "samples", os.path.join(inputs.root, name), others, name)
    return inputs


def _check_inputs_exist(inputs, stats) -> None:
    """Fail before writing anything when not one input can be found (a wrong SRC)."""
    if stats and all(size < 0 for size, _ in stats):
        first = os.path.join(inputs.root, inputs.paths[0])
        where = f" (paths in {inputs.list_file} are relative to SRC)" if inputs.list_file else ""
        raise ConversionError(f"none of the {len(stats)} input files exist, e.g. {first}{where}")


def prepare_inputs(src, list_file, options: dict, labels: bool = True):
    """(PackOptions, scanned inputs) of a conversion (PIL checked first: a missing PIL must
    not surface after a long scan)."""
    require_pil()
    if "shard_size" in options:
        options["shard_size"] = parse_size(options["shard_size"])
    source = {k: options.pop(k) for k in SOURCE_OPTIONS if k in options}  # containers.py
    opts = PackOptions(**options)
    from dlpack_io.packer.targetinputs import scan_targets, with_targets

    inputs = scan_targets(src, list_file, opts) or \
        _scan(src, list_file, labels, dict(source, progress=opts.progress))
    if inputs.list_file is not None and inputs.members is None:  # a list or a COCO file:
        via, outside = link_counts(inputs.root, inputs.paths)  # its links, counted as a scan's
        inputs = dataclasses.replace(inputs, via_links=via, outside_src=outside)
    return opts, with_targets(with_fields(inputs, opts.fields), opts)


def plan_inputs(inputs, opts: PackOptions):
    """(stats of the inputs, the journal's plan line): what decides the output bytes; fails
    before anything is written when not one input exists."""
    stats = stat_inputs(inputs) if inputs.members is None else \
        [(0, 0) if i in (inputs.bad or ()) else inputs.members.stat(p)
         for i, p in enumerate(inputs.paths)]
    _check_inputs_exist(inputs, stats)
    return stats, journal.plan_line(inputs, stats, opts.output_options(), fmt.FORMAT_VERSION)



# ---- the ordered parallel encode -------------------------------------------------------------
# Encode inputs in worker processes and hand results back in input order.
#
# Results come back in the order of the inputs whatever the number of workers, which is
# what makes the packed bytes independent of ``--workers``. At most ``max_in_flight``
# chunks are outstanding, so a slow writer never lets encoded pixels pile up in memory.
# A worker that dies (OOM killer, segfault in a decoder) surfaces as ConversionError
# instead of a hang: that is why this uses ProcessPoolExecutor and not multiprocessing.Pool.
def _encode_chunk(items: list, options: dict) -> list:
    return [encode_path(item, options, ship_passthrough=False) for item in items]


def _worker_init(parent_pid: int) -> None:
    """Make a worker die with the packer: after ``kill -9`` no orphan keeps running.

    Ctrl-C is left to the parent, which shuts the pool down and removes its partial shard.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux only)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _context():
    # fork starts workers in milliseconds; elsewhere fall back to the platform default.
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


def encode_in_order(items, options: dict, workers: int, *, chunk: int = 8,
                    max_in_flight: int | None = None):
    """Yield ``(status, value)`` from encode_path for each (path, size, mtime) item, in order.

    ``workers`` processes encode chunks of ``chunk`` files; ``workers == 0`` encodes in
    this process (used by tests and tiny jobs).
    """
    if workers == 0:
        for item in items:
            yield encode_path(item, options)
        return
    max_in_flight = max_in_flight or 4 * workers
    starts = iter(range(0, len(items), chunk))
    pending: deque = deque()
    with ProcessPoolExecutor(max_workers=workers, mp_context=_context(),
                             initializer=_worker_init, initargs=(os.getpid(),)) as pool:
        start = 0
        try:
            while True:
                while len(pending) < max_in_flight:
                    nxt = next(starts, None)
                    if nxt is None:
                        break
                    pending.append((nxt, pool.submit(_encode_chunk, items[nxt:nxt + chunk], options)))
                if not pending:
                    return
                start, future = pending.popleft()
                yield from future.result()
        except BrokenProcessPool:
            raise ConversionError(
                f"a worker process died while encoding {items[start][0]} .. "
                f"{items[min(start + chunk, len(items)) - 1][0]} (killed, out of memory, "
                f"or a crash in the image decoder); completed shards are kept, run "
                f"again with --resume") from None
        finally:
            for _, future in pending:
                future.cancel()



# ---- where a shard ends ----------------------------------------------------------------------
# THE rule that decides where one shard ends and the next begins, for every engine.
#
# Shards are cut by encoded size in packing order: a record starts a new shard when the
# current shard already holds a record and adding this one would pass ``shard_size`` bytes
# of record data. The local engine applies it while writing; the Ray engine applies it to
# the sizes its encode tasks report, before any shard is written. Both call this class, so
# both cut at the same records and produce the same bytes.
def footprint(data_format: str, payload_len: int) -> int:
    """Bytes one record adds to a shard's record data: record shards align each record
    (the writer pads it), LMDB shards store it as it is."""
    return fmt.align_up(payload_len) if data_format == "record" else payload_len


class ShardCutter:
    """Feed it every packed record's payload length, in packing order."""

    def __init__(self, data_format: str, shard_size: int):
        self.data_format = data_format
        self.shard_size = shard_size
        self.records = 0    # records in the current shard
        self.data_size = 0  # their footprint

    def starts_new_shard(self, payload_len: int) -> bool:
        """Account one record; True when the shard before it is full, so the record is
        the first of a new shard (the caller finishes the current shard first)."""
        new = self.records > 0 and self.data_size + payload_len > self.shard_size
        if new:
            self.records, self.data_size = 0, 0
        self.records += 1
        self.data_size += footprint(self.data_format, payload_len)
        return new
