"""``convert(src, dst, **options)``: scan, encode in parallel, write shards, then the manifest.

Crash safety: shards are published by rename and recorded in the journal; the manifest is
written last. After a kill at any moment, ``resume=True`` keeps the journaled shards and
redoes the rest, giving the same bytes as an uninterrupted run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from dlpack_io.packer import finalize, journal
from dlpack_io.packer.cutting import ShardCutter
from dlpack_io.packer.options import PackOptions, parse_size
from dlpack_io.packer.encode import require_pil
from dlpack_io.packer.pipeline import ConversionError, encode_in_order
from dlpack_io.packer.progress import Progress
from dlpack_io.packer.scan import read_list, scan_image_folder, stat_inputs
from dlpack_io.packer.writers import open_writer
from dlpack_io.reader import format as fmt
from dlpack_io.reader.urls import is_remote
from dlpack_io.packer.dstfiles import (check_src_dst, clear_outputs, existing_entries,
                                       verify_kept_shard)

log = logging.getLogger(__name__)


@dataclass
class _State:
    """Where packing stands: shards done, the next input position, rejects pending."""

    position: int = 0
    shards: list = field(default_factory=list)
    rejects: list = field(default_factory=list)
    reencoded: Counter = field(default_factory=Counter)
    lossless: Counter = field(default_factory=Counter)
    class_counts: np.ndarray | None = None

    @property
    def next_sample(self) -> int:
        return sum(s["num_samples"] for s in self.shards)


def packing_order(n: int, options: PackOptions) -> np.ndarray:
    """Input positions in packing order: a seeded permutation, or the scan order."""
    if options.shuffle:
        return np.random.default_rng(options.seed).permutation(n)
    return np.arange(n)


def _prepare_dst(dst: str, resume: bool, overwrite: bool) -> None:
    entries = existing_entries(dst)
    if entries and overwrite:
        clear_outputs(dst)
    elif entries and not resume:
        raise ConversionError(f"{dst} is not empty ({', '.join(sorted(entries)[:3])}...); pass "
                              f"--resume to finish an interrupted conversion or --overwrite "
                              f"to replace what is there")


def _resume_state(dst: str, plan: dict, num_classes: int) -> _State:
    state = _State(class_counts=np.zeros(num_classes, dtype=np.int64))
    old_plan, done = journal.read_journal(dst)
    if old_plan is not None and old_plan["plan"] != plan["plan"]:
        raise ConversionError(f"{dst}: the source files or packing options differ from the "
                              f"interrupted conversion's, so it cannot be resumed; use "
                              f"--overwrite to start again")
    for entry in done if old_plan else []:
        if not verify_kept_shard(dst, entry["shard"]):
            log.warning("shard %s from the interrupted run is damaged; redoing from there",
                        entry["shard"]["name"])
            break
        state.shards.append(entry["shard"])
        state.position = entry["end_input"]
        state.rejects += [tuple(r) for r in entry["rejects"]]
        state.reencoded.update(entry["reencoded"])
        state.lossless.update(entry.get("lossless", {}))
        state.class_counts += np.asarray(entry["class_counts"], dtype=np.int64)
    kept = {s["name"] for s in state.shards}
    clear_outputs(dst, keep=kept)
    journal.Journal(dst, plan, [e for e in done if e["shard"]["name"] in kept])
    return state


class _Packer:
    """Consumes encoded inputs in order and cuts them into shards (ShardCutter's rule).

    The Ray engine subclasses it to plan shards instead of writing them; rejects, counts
    and the journal are kept here for both engines.
    """

    def __init__(self, dst, inputs, options: PackOptions, state: _State, journal_: journal.Journal):
        self.dst, self.inputs, self.options, self.state = dst, inputs, options, state
        self.journal = journal_
        self.writer = None
        self.cutter = ShardCutter(options.format, options.shard_size)
        self.since = _State(class_counts=np.zeros(len(inputs.classes), dtype=np.int64))

    def reject(self, rel: str, reason: str) -> None:
        if self.options.on_error == "fail":
            raise ConversionError(f"{os.path.join(self.inputs.root, rel)}: {reason} "
                                  f"(--on-error fail stops at the first bad input)")
        log.debug("skipping %s: %s", rel, reason)
        self.since.rejects.append((rel, reason))

    def add(self, rel: str, label: int, record, position: int) -> None:
        if self.cutter.starts_new_shard(len(record.payload)):
            self.finish_shard(position)
        if self.writer is None:
            self.writer = open_writer(self.options.format, self.dst, len(self.state.shards),
                                      self.state.next_sample, self.options.shard_size)
        self.writer.add(record, label, rel)
        self.count(label, record.reencoded, record.lossless)

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
        entry = self.writer.finish()
        self.writer = None
        self.commit(entry, end_input, self.take_since())

    def take_since(self) -> _State:
        """Hand over the open shard's rejects and counts; start afresh for the next one."""
        since = self.since
        self.since = _State(class_counts=np.zeros_like(since.class_counts))
        return since

    def commit(self, entry: dict, end_input: int, since: _State) -> None:
        """Journal a published shard, then count it as done (shards in order)."""
        self.journal.append({"shard": entry, "end_input": end_input, "rejects": since.rejects,
                             "reencoded": dict(since.reencoded), "lossless": dict(since.lossless),
                             "class_counts": since.class_counts.tolist()})
        st = self.state
        st.shards.append(entry)
        st.rejects += since.rejects
        st.reencoded.update(since.reencoded)
        st.lossless.update(since.lossless)
        st.class_counts += since.class_counts

    def has_open_shard(self) -> bool:
        """True while records wait to be written into a shard."""
        return self.writer is not None

    def close(self, end_input: int) -> None:
        if self.has_open_shard():
            self.finish_shard(end_input)
        self.state.rejects += self.since.rejects  # trailing rejects after the last record

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
            self.writer = None


def _fetch_passthrough(record, path: str):
    """Give a passthrough record its bytes back by re-reading the file; the CRC computed
    by the worker proves they are the bytes it validated. Returns None if they are not."""
    if record.payload is not None:
        return record
    with open(path, "rb") as f:
        data = f.read()
    if fmt.crc32(data) != record.crc:
        return None
    return dataclasses.replace(record, payload=data)


def _encode_options(options: PackOptions) -> dict:
    return {"mode": options.mode, "size": options.size, "max_side": options.max_side,
            "quality": options.quality, "validate": options.validate,
            "restarts": options.jpeg_restarts, "non_jpeg": options.non_jpeg,
            "max_pixels": options.max_pixels}


def _pack(dst, inputs, stats, options: PackOptions, state: _State, journal_) -> Progress:
    order = packing_order(len(inputs.paths), options)
    todo = order[state.position:]
    files = [(os.path.join(inputs.root, inputs.paths[i]), *stats[i]) for i in todo]
    progress = Progress(len(order), f"convert {os.path.basename(dst)}",
                        enabled=options.progress, initial=state.position)
    packer = _Packer(dst, inputs, options, state, journal_)
    try:
        results = encode_in_order(files, _encode_options(options), options.num_workers)
        for position, i, (status, value) in zip(range(state.position, len(order)), todo, results):
            rel = inputs.paths[i]
            if status == "ok":
                value = _fetch_passthrough(value, files[position - state.position][0])
                if value is None:
                    status, value = "reject", "file changed while packing (content differs " \
                                              "from what was validated); re-run to pack it"
            if status == "reject":
                packer.reject(rel, value)
                progress.update(1)
                continue
            packer.add(rel, inputs.labels[i], value, position)
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


def _scan(src, list_file, labels: bool):
    if list_file and not labels:
        raise ValueError("--no-labels packs a folder without classes; a --list gives labels: "
                         "use one or the other")
    inputs = read_list(src, list_file) if list_file else scan_image_folder(src, labels=labels)
    for name, others in inputs.empty_classes:
        log.warning("class folder %s has no usable image (%d other files, none an image, "
                    "or a folder already packed through a symlink): class %r will have 0 "
                    "samples", os.path.join(inputs.root, name), others, name)
    return inputs


def _summary(dst, manifest, state, inputs, progress, resumed_from) -> dict:
    empty = [c for c, n in zip(manifest["classes"], manifest["class_counts"]) if n == 0]
    return {"dst": dst, "num_samples": manifest["num_samples"], "num_shards": len(state.shards),
            "num_bytes": manifest["num_bytes"], "rejects": len(state.rejects),
            "reencoded": dict(state.reencoded), "lossless": dict(state.lossless),
            "ignored": dict(inputs.ignored or {}), "resumed_from": resumed_from,
            "seconds": progress.elapsed, "images_per_s": progress.images_per_s,
            "mb_per_s": progress.mb_per_s, "empty_classes": empty,
            "via_links": inputs.via_links, "outside_src": inputs.outside_src,
            "repeated_dirs": inputs.repeated_dirs}


def _retry_advice(dst: str, kept: int) -> str:
    """The one command that retries a failed conversion, given what it left in ``dst``."""
    if kept:
        return (f"{kept} completed shards are kept in {dst}: after fixing this, run the same "
                f"command with --resume")
    return f"nothing was left in {dst}: after fixing this, run the same command again"


def _discard_if_empty(dst: str, created: bool, state) -> None:
    """After a failed run that completed no shard, remove every file it wrote (journal,
    partial shards) and the folder it created, so the same command can simply run again."""
    if state is None or state.shards:  # state None: the journal there is not this run's
        return
    clear_outputs(dst)
    if created:
        try:
            os.rmdir(dst)  # only if empty: the lock file is gone, nothing else is ours
        except OSError:
            pass


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
    opts = PackOptions(**options)
    return opts, _scan(src, list_file, labels)


def plan_inputs(inputs, opts: PackOptions):
    """(stats of the inputs, the journal's plan line): what decides the output bytes; fails
    before anything is written when not one input exists."""
    stats = stat_inputs(inputs)
    _check_inputs_exist(inputs, stats)
    return stats, {"plan": journal.plan_hash(inputs, stats, opts.output_options(),
                                             fmt.FORMAT_VERSION), "num_inputs": len(inputs.paths)}


ENGINES = ("local", "ray")


def _engine(engine: str, ray_address, opts: PackOptions):
    """A context manager that yields the function packing the inputs: worker processes
    here (local) or tasks on a Ray cluster. Raises at once for a bad choice or missing Ray."""
    if engine == "local":
        if ray_address is not None:
            raise ValueError("--ray-address is for --engine ray (the local engine uses this "
                             "machine's cores)")
        return contextlib.nullcontext(_pack)
    if engine == "ray":
        from dlpack_io.packer import ray_engine

        return ray_engine.connection(ray_address, opts)
    raise ValueError(f"engine {engine!r}: expected one of {ENGINES}")


def convert(src, dst, *, list_file=None, resume: bool = False, overwrite: bool = False,
            labels: bool = True, provenance: bool = True, engine: str = "local",
            ray_address: str | None = None, **options) -> dict:
    """Pack the images under ``src`` into a data set at ``dst``; return a summary dict.

    ``options`` are PackOptions fields (format, mode, size, max_side, quality, shard_size,
    seed, shuffle, validate, jpeg_restarts, workers, on_error, progress). ``list_file`` reads
    ``path,label`` rows instead of scanning class folders; ``labels=False`` packs every
    image under ``src`` with label -1 and no classes. ``provenance=False`` leaves the host
    name and the absolute source paths out of the manifest (a data set meant for sharing).
    ``engine="ray"`` runs the work as tasks on a Ray cluster (``ray_address``; none: a
    private one on this machine) with byte-identical output. Raises ConversionError with
    the file and the fix when the job cannot complete; a run that completed no shard
    leaves nothing behind, so the advice is to run it again.
    """
    if is_remote(dst):  # s3://bucket/prefix: pack locally, upload (packer/upload.py)
        from dlpack_io.packer.upload import convert_remote

        if engine != "local":
            raise ValueError("--engine ray writes to a shared file system; an s3:// DST is "
                             "packed by the local engine (pack to a shared folder, or use "
                             "--engine local)")
        return convert_remote(src, dst, list_file=list_file, resume=resume,
                              overwrite=overwrite, labels=labels, provenance=provenance,
                              **options)
    if options.pop("staging", None) is not None:
        raise ValueError("--staging is for s3:// destinations (shards waiting for upload)")
    check_src_dst(src, dst)
    opts, inputs = prepare_inputs(src, list_file, options, labels)
    engine_ = _engine(engine, ray_address, opts)
    stats, plan = plan_inputs(inputs, opts)
    dst = os.path.abspath(dst)
    created = not os.path.exists(dst)
    lock = journal.DstLock(dst)
    try:
        os.makedirs(dst, exist_ok=True)
        lock.acquire()
    except OSError as exc:
        raise ConversionError(f"{dst}: cannot create or write the destination folder "
                              f"({exc.strerror or exc}); choose a writable DST") from None
    try:
        if resume and os.path.exists(os.path.join(dst, fmt.MANIFEST_NAME)) \
                and journal.read_journal(dst)[0] is None:
            log.info("%s is already complete; nothing to resume", dst)
            lock.release(remove=True)
            return {"dst": dst, "already_complete": True}
        with engine_ as pack:  # Ray connects here, after the lock and before DST changes
            _prepare_dst(dst, resume, overwrite)
            return _convert_locked(src, dst, inputs, stats, plan, opts, pack, lock, created,
                                   engine, provenance)
    finally:
        lock.release(remove=True)


def _convert_locked(src, dst, inputs, stats, plan, opts, pack, lock, created, engine,
                    provenance) -> dict:
    """Take over what a resumed run kept, pack the rest, write the manifest; on failure
    leave nothing behind when no shard was completed, and name the one retry command."""
    state = None
    try:
        state = _resume_state(dst, plan, len(inputs.classes))
        resumed_from = state.position
        progress = pack(dst, inputs, stats, opts, state, journal.Journal(dst))
        manifest = _finish(src, dst, inputs, opts, state, progress, engine, provenance)
    except ConversionError as exc:
        lock.release(remove=True)  # first: the lock file must go for the folder to go
        _discard_if_empty(dst, created, state)
        raise ConversionError(f"{exc}; {_retry_advice(dst, len(state.shards) if state else 0)}") \
            from exc.__cause__
    except BaseException:
        lock.release(remove=True)
        _discard_if_empty(dst, created, state)
        raise
    return dict(_summary(dst, manifest, state, inputs, progress, resumed_from), engine=engine)


def _finish(src, dst, inputs, opts: PackOptions, state: _State, progress, engine: str,
            provenance: bool) -> dict:
    """Write rejects.tsv and, last, the manifest; drop the journal. Returns the manifest."""
    if not state.shards:
        reasons = Counter(r for _, r in state.rejects).most_common(3)
        raise ConversionError(f"{src}: none of the {len(inputs.paths)} inputs could be "
                              f"packed; most common reasons: "
                              + "; ".join(f"{why} ({n}x)" for why, n in reasons))
    manifest = finalize.build_manifest(inputs, opts, state.shards, state.rejects,
                                       state.reencoded, state.class_counts.tolist(),
                                       progress.elapsed, state.lossless, provenance=provenance,
                                       engine=engine)
    try:
        finalize.write_dataset_files(dst, manifest, state.rejects)
    except OSError as exc:
        raise ConversionError(f"{dst}: cannot write the manifest ({exc.strerror or exc}); "
                              f"all shards are complete, free space") from exc
    journal.Journal(dst).remove()
    return manifest
