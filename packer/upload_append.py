"""``convert(src, "s3://bucket/prefix", append=True)``: the append of appending.py onto a
data set in object storage. The data set's manifest and its shards' metadata are read
from the bucket (record shards: two range requests each; LMDB shards, whose metadata is
not at a known range: downloaded once into the staging folder); the new shards are packed
locally and uploaded one by one with the journal in the bucket (upload.py's), and the new
manifest is uploaded last: one PUT replaces the object whole, so a reader gets the old
manifest or the new one, never a part. Old shard objects are never written.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile

from dlpack_io.packer import appending, finalize, journal, quickcheck, replacing
from dlpack_io.packer import appendbase as base_
from dlpack_io.packer.dstfiles import kept_shard_meta
from dlpack_io.packer.engines import engine_context
from dlpack_io.packer.pipeline import ConversionError
from dlpack_io.packer.remoteshard import remote_shard_meta
from dlpack_io.packer.upload import RemoteJournal, resume_remote
from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote.storage import StorageError, Store

log = logging.getLogger(__name__)


def remote_base(store: Store) -> dict:
    """The validated manifest of the data set at ``store``'s URL."""
    if store.head(fmt.MANIFEST_NAME) is None:
        raise ConversionError(f"{store.url}: no {fmt.MANIFEST_NAME}, so no data set to append "
                              f"to; convert SRC into it without --append first")
    data = store.get(fmt.MANIFEST_NAME, max_bytes=fmt.MAX_MANIFEST_BYTES)
    return base_.parse_base(data, store.where(fmt.MANIFEST_NAME))


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
                                        None if checksum else quickcheck.read_remote(store, base),
                                        replace_changed)
            if not app.inputs.paths:
                quickcheck.write_remote(store, app.split.stats, base)
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
    except replacing.PairingError:  # nothing worth resuming: the data set stays as it was
        for entry in state.shards[len(base["shards"]):]:
            store.delete(entry["name"])
        store.delete(journal.JOURNAL_NAME)
        raise
    quickcheck.write_remote(store, appending.record_of(app, resumed_from), manifest)
    data = finalize.manifest_bytes(manifest, store.url)
    store.put(fmt.REJECTS_NAME, finalize.rejects_tsv(state.rejects))
    store.put(fmt.MANIFEST_NAME, data)  # last: now readers see it
    store.delete(journal.JOURNAL_NAME)
    return appending.append_summary(store.url, manifest, state, app, progress, resumed_from,
                                    "local")
