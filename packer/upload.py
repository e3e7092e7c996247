"""``convert(src, "s3://bucket/prefix")``: pack locally, upload each shard as it is finished,
the manifest last.

The local engine does the packing (same writers, same bytes) into a staging folder; each
finished shard is uploaded by a background thread (multipart when large) while the next one
is being packed, checked on the server (size and header checksum), deleted locally and
recorded in the journal, which lives in the bucket (``prefix/.dlpack-convert.journal``,
rewritten whole after every shard) so ``--resume`` works from any machine. The manifest is
uploaded last and the journal deleted after it: until then no reader sees a data set.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import tempfile
import threading
from collections import Counter

from dlpack_io.packer import finalize, journal
from dlpack_io.packer.pipeline import ConversionError
from dlpack_io.reader import format as fmt
from dlpack_io.reader.storage import StorageError, Store

log = logging.getLogger(__name__)
_OURS_PREFIXES = ("shard-", fmt.MANIFEST_NAME, fmt.REJECTS_NAME, journal.JOURNAL_NAME)


class RemoteJournal:
    """The journal of an upload; ``append`` queues a finished shard for upload."""

    def __init__(self, store: Store, staging: str, plan: dict, kept: list):
        self.store, self.staging = store, staging
        self.lines = [plan] + list(kept)
        self._write()
        self._queue: queue.Queue = queue.Queue(maxsize=1)  # pack one shard ahead, no more
        self._error = None
        self._thread = threading.Thread(target=self._upload_loop, name="dlpack-upload", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        data = "".join(json.dumps(line, sort_keys=True) + "\n" for line in self.lines)
        self.store.put(journal.JOURNAL_NAME, data.encode())

    def append(self, entry: dict) -> None:
        """(Packing thread) a shard is finished in the staging folder: upload it."""
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


def upload_shard(store: Store, staging: str, entry: dict) -> None:
    """Upload one finished shard, check it on the server, delete the local copy."""
    path = os.path.join(staging, entry["name"])
    store.put_file(entry["name"], path)
    if not remote_shard_ok(store, entry):
        raise StorageError(f"{store.where(entry['name'])}: the uploaded object does not match "
                           f"the shard that was written (size or header checksum)")
    os.unlink(path)


def remote_shard_ok(store: Store, entry: dict) -> bool:
    """The object is the shard the journal describes: size, and header CRC for records."""
    head = store.head(entry["name"])
    if head is None or head["size"] != entry["bytes"]:
        return False
    if not entry["name"].endswith(fmt.SHARD_SUFFIX["record"]):
        return True
    page = store.get_range(entry["name"], 0, fmt.HEADER_SIZE)
    try:
        header = fmt.unpack_header(page, entry["bytes"], store.where(entry["name"]))
    except fmt.FormatError:
        return False
    return header.header_crc == entry["crc"]


def _read_journal(store: Store):
    head = store.head(journal.JOURNAL_NAME)
    if head is None:
        return None, []
    lines = []
    for line in store.get(journal.JOURNAL_NAME).decode("utf-8", "replace").split("\n"):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            break
    if not lines or "plan" not in lines[0]:
        return None, []
    return lines[0], lines[1:]


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
        raise ConversionError(f"{store.url} is not empty ({', '.join(sorted(found)[:3])}...); "
                              f"pass --resume to finish an interrupted conversion or "
                              f"--overwrite to replace what is there")
    if fmt.MANIFEST_NAME in found and journal.JOURNAL_NAME not in found:
        return "complete"
    return None


def resume_remote(store: Store, plan: dict, num_classes: int, state):
    """Fill ``state`` (conversion._State) from the bucket's journal; returns the kept lines."""
    import numpy as np

    old_plan, done = _read_journal(store)
    if old_plan is not None and old_plan["plan"] != plan["plan"]:
        raise ConversionError(f"{store.url}: the source files or packing options differ from "
                              f"the interrupted conversion's; use --overwrite to start again")
    kept = []
    for entry in done if old_plan else []:
        if not remote_shard_ok(store, entry["shard"]):
            log.warning("shard %s of the interrupted upload is missing or damaged; redoing "
                        "from there", entry["shard"]["name"])
            break
        kept.append(entry)
        state.shards.append(entry["shard"])
        state.position = entry["end_input"]
        state.rejects += [tuple(r) for r in entry["rejects"]]
        state.reencoded.update(entry["reencoded"])
        state.class_counts += np.asarray(entry["class_counts"], dtype=np.int64)
    names = {e["shard"]["name"] for e in kept}
    for name in _ours(store):
        if name.startswith("shard-") and name not in names or name == fmt.MANIFEST_NAME:
            store.delete(name)
    return kept


def convert_remote(src, url: str, *, list_file=None, resume: bool = False,
                   overwrite: bool = False, staging=None, storage_options=None,
                   labels: bool = True, provenance: bool = True, **options) -> dict:
    """Pack ``src`` and upload it to ``url``; the summary dict of conversion.convert."""
    from dlpack_io.packer import conversion

    opts, inputs = conversion.prepare_inputs(src, list_file, options, labels)
    try:
        store = Store(url, storage_options=storage_options)
        if prepare_remote(store, resume=resume, overwrite=overwrite) == "complete":
            log.info("%s is already complete; nothing to resume", url)
            return {"dst": url, "already_complete": True}
        stage = tempfile.mkdtemp(prefix="dlpack-upload-", dir=staging)
        try:
            return _convert_staged(store, stage, inputs, opts, provenance)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    except StorageError as exc:
        raise ConversionError(f"{exc}; shards uploaded so far are kept: run again with "
                              f"--resume") from exc


def _convert_staged(store: Store, stage: str, inputs, opts, provenance: bool) -> dict:
    import numpy as np

    from dlpack_io.packer import conversion

    stats, plan = conversion.plan_inputs(inputs, opts)
    state = conversion._State(class_counts=np.zeros(len(inputs.classes), dtype=np.int64))
    kept = resume_remote(store, plan, len(inputs.classes), state)
    resumed_from = state.position
    journal_ = RemoteJournal(store, stage, plan, kept)
    try:
        progress = conversion._pack(stage, inputs, stats, opts, state, journal_)
        journal_.finish()
    except BaseException:
        journal_.abort()
        raise
    if not state.shards:
        reasons = Counter(r for _, r in state.rejects).most_common(3)
        raise ConversionError(f"{inputs.root}: none of the {len(inputs.paths)} inputs could be "
                              f"packed; most common reasons: "
                              + "; ".join(f"{why} ({n}x)" for why, n in reasons))
    manifest = finalize.build_manifest(inputs, opts, state.shards, state.rejects,
                                       state.reencoded, state.class_counts.tolist(),
                                       progress.elapsed, state.lossless, provenance=provenance)
    store.put(fmt.REJECTS_NAME, finalize.rejects_tsv(state.rejects))
    store.put(fmt.MANIFEST_NAME, fmt.encode_meta(manifest))  # last: now it is a data set
    store.delete(journal.JOURNAL_NAME)
    return conversion._summary(store.url, manifest, state, inputs, progress, resumed_from)
