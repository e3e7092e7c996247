"""``convert(src, "s3://bucket/prefix")``: pack locally, upload each shard as it is finished,
the manifest last.

The local engine does the packing (same writers, same bytes) into a staging folder; each
finished shard is uploaded by a background thread (multipart when large) while the next one
is being packed, checked on the server (size and header checksum), deleted locally and
recorded in the journal, which lives in the bucket (``prefix/.dlpack-convert.journal``,
rewritten whole after every shard) so ``--resume`` works from any machine. The manifest is
uploaded last and the journal deleted after it: until then no reader sees a data set.
With ``engine="ray"`` the Ray engine's shard tasks upload their shards themselves (see
packer/engines.py) and this module keeps the rest: the journal, resume,
the manifest.
"""
from __future__ import annotations

import logging
import os
import queue
import shutil
import tempfile
import threading

from dlpack_io.packer import appendbase, appending, finalize, journal, packing
from dlpack_io.packer.engines import engine_context
from dlpack_io.packer.finalize import kept_shard_meta, not_empty_error
from dlpack_io.packer.records import ConversionError
from dlpack_io.packer.scan import shown
from dlpack_io.packer.writers import (remote_shard_meta, remote_shard_ok, remote_shard_paths,
                                      upload_shard)
from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote.storage import StorageError, Store

log = logging.getLogger(__name__)
_OURS_PREFIXES = ("shard-", fmt.MANIFEST_NAME, fmt.REJECTS_NAME, journal.JOURNAL_NAME,
                  appendbase.NAME)


class RemoteJournal:
    """The journal of an upload; ``append`` queues a finished shard for upload."""

    def __init__(self, store: Store, staging: str, plan: dict, kept: list, *,
                 uploaded: bool = False):
        self.store, self.staging, self.uploaded = store, staging, uploaded
        self.lines = [plan] + list(kept)
        self._write()
        self._queue: queue.Queue = queue.Queue(maxsize=1)  # pack one shard ahead, no more
        self._error = None
        self._thread = threading.Thread(target=self._upload_loop, name="dlpack-upload", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        data = "".join(journal.journal_line(line) for line in self.lines)
        self.store.put(journal.JOURNAL_NAME, data.encode())

    def append(self, entry: dict) -> None:
        """(Packing thread) a shard is finished in the staging folder: upload it (or, when
        ``uploaded``, a task has already uploaded and checked it: journal it)."""
        self._raise_if_failed()
        self._queue.put(entry)

    def _upload_loop(self) -> None:
        while True:
            entry = self._queue.get()
            if entry is None:
                return
            if self._error is not None:
                continue  # drain: the packing thread will see the error
            try:
                if not self.uploaded:
                    upload_shard(self.store, self.staging, entry["shard"])
                self.lines.append(entry)
                self._write()
            except BaseException as exc:
                self._error = exc

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise ConversionError(f"{self.store.url}: upload failed ({self._error}); shards "
                                  f"uploaded so far are kept: fix the cause and run again "
                                  f"with --resume") from self._error

    def finish(self) -> None:
        """Wait for every queued upload; raise the first failure."""
        self._queue.put(None)
        self._thread.join()
        self._raise_if_failed()

    def abort(self) -> None:
        """Stop after the upload in progress (used when packing fails)."""
        self._error = self._error or RuntimeError("conversion stopped")
        self._queue.put(None)
        self._thread.join()


def _read_journal(store: Store):
    head = store.head(journal.JOURNAL_NAME)
    if head is None:
        return None, []
    return journal.parse_journal(store.get(journal.JOURNAL_NAME).decode("utf-8", "replace"))


def _ours(store: Store) -> dict:
    return {name: size for name, size in store.list().items()
            if "/" not in name and name.startswith(_OURS_PREFIXES)}


def prepare_remote(store: Store, *, resume: bool, overwrite: bool) -> str | None:
    """Check what is at the URL; returns "complete" if resuming a finished upload."""
    found = _ours(store)
    if not found:
        return None
    if overwrite:
        if fmt.MANIFEST_NAME in found:  # first make the old data set invisible
            store.delete(fmt.MANIFEST_NAME)
        for name in found:
            store.delete(name)
        return None
    if not resume:
        raise not_empty_error(store.url, found)
    if fmt.MANIFEST_NAME in found and journal.JOURNAL_NAME not in found:
        return "complete"
    return None


def resume_remote(store: Store, plan: dict, num_classes: int, state, inputs=None, opts=None,
                  keep=frozenset()):
    """Fill ``state`` (packing.State) from the bucket's journal; returns the kept lines.
    With ``inputs`` and ``opts``, each kept record shard's own source paths must match the
    inputs its journal line covers (accounting.paths_problem). Deletes our objects but the
    kept shards and the names in ``keep`` (an append's data set)."""
    old_plan, done = _read_journal(store)
    refused = journal.refusal(store.url, old_plan, plan) if old_plan is not None else None
    if refused:
        raise ConversionError(refused)
    kept = []
    for entry in journal.accounted(done, old_plan, num_classes, store.url) if old_plan else []:
        if not remote_shard_ok(store, entry["shard"]):
            log.warning("shard %s of the interrupted upload is missing or damaged; redoing "
                        "from there", entry["shard"]["name"])
            break
        problem = _disagrees(store, entry, inputs, opts, state.position)
        if problem:
            log.warning("%s: the journal line of shard %s disagrees with the shard (%s); "
                        "redoing from there", store.url, entry["shard"]["name"], problem)
            break
        kept.append(entry)
        state.take_over(entry)
    names = {e["shard"]["name"] for e in kept} | set(keep)
    for name in _ours(store):
        if name.startswith("shard-") and name not in names or \
                (name == fmt.MANIFEST_NAME and name not in names):
            store.delete(name)
    return kept


def _disagrees(store: Store, entry: dict, inputs, opts, start: int) -> str | None:
    """accounting.paths_problem for a shard in the bucket (None for LMDB shards, whose
    metadata cannot be read by range, and when no inputs are given)."""
    if inputs is None or not entry["shard"]["name"].endswith(fmt.SHARD_SUFFIX["record"]):
        return None
    order = packing.packing_order(len(inputs.paths), opts)
    covered = [shown(inputs.paths[i]) for i in order[start:entry["end_input"]].tolist()]
    return journal.paths_problem(entry, covered, remote_shard_paths(store, entry["shard"]))


def convert_remote(src, url: str, *, list_file=None, resume: bool = False,
                   overwrite: bool = False, staging=None, storage_options=None,
                   labels: bool = True, provenance: bool = True, engine: str = "local",
                   ray_address=None, **options) -> dict:
    """Pack ``src`` and upload it to ``url``; the summary dict of conversion.convert.
    ``engine``/``ray_address`` as there: with "ray" the cluster's tasks upload the shards."""
    opts, inputs = packing.prepare_inputs(src, list_file, options, labels)
    engine_ = engine_context(engine, ray_address, opts)
    started = False  # nothing written to the bucket before this
    try:
        store = Store(url, storage_options=storage_options)
        if prepare_remote(store, resume=resume, overwrite=overwrite) == "complete":
            log.info("%s is already complete; nothing to resume", url)
            return {"dst": url, "already_complete": True}
        started = True
        stage = tempfile.mkdtemp(prefix="dlpack-upload-", dir=staging)
        try:
            with engine_ as pack:
                return _convert_staged(store, stage, inputs, opts, provenance, pack, engine)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    except StorageError as exc:  # before the first write: nothing to resume from
        advice = ("shards uploaded so far are kept: run again with --resume" if started else
                  "nothing was uploaded: fix that and run the same command again")
        raise ConversionError(f"{exc}; {advice}") from exc


def _convert_staged(store: Store, stage: str, inputs, opts, provenance: bool, pack,
                    engine: str) -> dict:
    import numpy as np

    stats, plan = packing.plan_inputs(inputs, opts)
    state = packing.State(class_counts=np.zeros(len(inputs.classes), dtype=np.int64))
    kept = resume_remote(store, plan, len(inputs.classes), state, inputs, opts)
    resumed_from = state.position
    seen = {} if resumed_from else appendbase.stat_all(inputs)  # before a byte is read
    ray = engine == "ray"
    extra = {"upload": (store.url, store.explicit_options)} if ray else {}
    if ray:  # before the journal: a node that cannot write leaves the bucket as it was
        from dlpack_io.packer import engines

        engines.probe_nodes(engines.import_ray(), *extra["upload"])
    journal_ = RemoteJournal(store, stage, plan, kept, uploaded=ray)
    try:
        progress = pack(stage, inputs, stats, opts, state, journal_, **extra)
        journal_.finish()
    except BaseException:
        journal_.abort()
        raise
    manifest = finalize.final_manifest(inputs.root, inputs, opts, state, progress, engine,
                                       provenance)
    if seen:
        appendbase.write_remote(store, seen, manifest)
    data = finalize.manifest_bytes(manifest, store.url)
    store.put(fmt.REJECTS_NAME,
              finalize.rejects_tsv(state.rejects + finalize.annotation_rejects(inputs)))
    store.put(fmt.MANIFEST_NAME, data)  # last: now it is a data set
    store.delete(journal.JOURNAL_NAME)
    if ray:
        engines.remove_probes(store)
    return dict(finalize.summary(store.url, manifest, state, inputs, progress, resumed_from),
                engine=engine)


# ---- an append to a data set in object storage -----------------------------------------------
# ``convert(src, "s3://bucket/prefix", append=True)``: the append of appending.py onto a
# data set in object storage. The data set's manifest and its shards' metadata are read
# from the bucket (record shards: two range requests each; LMDB shards, whose metadata is
# not at a known range: downloaded once into the staging folder); the new shards are packed
# locally and uploaded one by one with the journal in the bucket (as a fresh upload does),
# and the new manifest is uploaded last: one PUT replaces the object whole, so a reader gets the old
# manifest or the new one, never a part. Old shard objects are never written.


def remote_base(store: Store) -> dict:
    """The validated manifest of the data set at ``store``'s URL."""
    if store.head(fmt.MANIFEST_NAME) is None:
        raise ConversionError(f"{store.url}: no {fmt.MANIFEST_NAME}, so no data set to append "
                              f"to; convert SRC into it without --append first")
    data = store.get(fmt.MANIFEST_NAME, max_bytes=fmt.MAX_MANIFEST_BYTES)
    return appendbase.parse_base(data, store.where(fmt.MANIFEST_NAME))


def remote_metas(store: Store, shards: list, stage: str) -> list:
    """(shard entry, its metadata or None) of every shard in the bucket."""
    out = []
    for entry in shards:
        meta = remote_shard_meta(store, entry)
        if meta is None and entry["name"].endswith(fmt.SHARD_SUFFIX["lmdb"]):
            _download(store, entry, stage)
            meta = kept_shard_meta(stage, entry)
            os.unlink(os.path.join(stage, entry["name"]))
        out.append((entry, meta))
    return out


def _download(store: Store, entry: dict, stage: str) -> None:
    """One shard object into ``stage`` (its size as the manifest says, no more)."""
    with open(os.path.join(stage, entry["name"]), "wb") as f:
        f.write(store.get(entry["name"], max_bytes=entry["bytes"]))


def append_remote(src, url: str, *, list_file=None, resume: bool = False,
                  overwrite: bool = False, replace_changed: bool = False, checksum=False,
                  staging=None,
                  storage_options=None, labels: bool = True, provenance: bool = True,
                  engine: str = "local", ray_address=None, **options) -> dict:
    """Append the inputs of ``src`` not yet in the data set at ``url``; appending's summary."""
    appending.check_request(url, overwrite)
    if engine != "local":
        raise ConversionError(f"{url}: appending to an s3:// data set runs on the local "
                              f"engine; leave --engine out")
    try:
        store = Store(url, storage_options=storage_options)
        base = remote_base(store)
        appending.check_no_journal(url, journal.parse_journal(
            store.get(journal.JOURNAL_NAME).decode("utf-8", "replace"))[0]
            if store.head(journal.JOURNAL_NAME) else None, resume)
        stage = tempfile.mkdtemp(prefix="dlpack-append-", dir=staging)
        try:
            app = appending.plan_append(src, list_file, labels, options, base,
                                        remote_metas(store, base["shards"], stage),
                                        None if checksum else appendbase.read_remote(store, base),
                                        replace_changed)
            if not app.inputs.paths:
                appendbase.write_remote(store, app.split.stats, base)
                if store.head(journal.JOURNAL_NAME):  # its append's manifest landed
                    store.delete(journal.JOURNAL_NAME)
                return appending.nothing_new(url, base, app)
            with engine_context(engine, ray_address, app.opts) as pack:
                return _append_staged(store, stage, base, app, pack, provenance)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    except StorageError as exc:
        raise ConversionError(f"{exc}; the data set's manifest is unchanged until the new one "
                              f"is uploaded: run again with --resume") from exc


def _append_staged(store: Store, stage: str, base: dict, app, pack, provenance: bool) -> dict:
    state = appending.seeded_state(base, len(app.inputs.classes), app.retried)
    keep = {s["name"] for s in base["shards"]} | {fmt.MANIFEST_NAME, fmt.REJECTS_NAME}
    kept = resume_remote(store, app.plan, len(app.inputs.classes), state, app.inputs,
                         app.opts, keep)
    resumed_from = state.position
    journal_ = RemoteJournal(store, stage, app.plan, kept)
    try:
        progress = pack(stage, app.inputs, app.stats, app.opts, state, journal_)
        journal_.finish()
    except BaseException:
        journal_.abort()
        raise
    try:
        manifest = appending.union_of(base, app, state, progress, "local", provenance)
    except appendbase.PairingError:  # nothing worth resuming: the data set stays as it was
        for entry in state.shards[len(base["shards"]):]:
            store.delete(entry["name"])
        store.delete(journal.JOURNAL_NAME)
        raise
    appendbase.write_remote(store, appending.record_of(app, resumed_from), manifest)
    data = finalize.manifest_bytes(manifest, store.url)
    store.put(fmt.REJECTS_NAME, finalize.rejects_tsv(state.rejects))
    store.put(fmt.MANIFEST_NAME, data)  # last: now readers see it
    store.delete(journal.JOURNAL_NAME)
    return appending.append_summary(store.url, manifest, state, app, progress, resumed_from,
                                    "local")
