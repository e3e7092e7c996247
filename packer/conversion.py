"""``convert(src, dst, ...)``: scan, encode in parallel, write shards, then the manifest.

Crash safety: shards are published by rename and recorded in the journal; the manifest is
written last. After a kill at any moment, ``resume=True`` keeps the journaled shards and
redoes the rest, giving the same bytes as an uninterrupted run. This module owns DST (the
lock, what a resumed run keeps, the manifest); packing.py does the packing, engines.py
picks who runs it, upload.py handles an s3:// DST.
"""
from __future__ import annotations

import logging
import os

from dlpack_io.packer import appendbase, finalize, journal
from dlpack_io.packer.engines import engine_context
from dlpack_io.packer.fields import check_engine_fields
from dlpack_io.packer.finalize import (check_src_dst, clear_outputs, existing_entries,
                                       not_empty_error, resume_state)
from dlpack_io.packer.options import PackOptions
from dlpack_io.packer.packing import State, plan_inputs, prepare_inputs
from dlpack_io.packer.records import ConversionError
from dlpack_io.reader import format as fmt
from dlpack_io.reader.remote.clouds import is_remote

log = logging.getLogger(__name__)


def _prepare_dst(dst: str, resume: bool, overwrite: bool) -> None:
    entries = existing_entries(dst)
    if entries and overwrite:
        clear_outputs(dst)
    elif entries and not resume:
        raise not_empty_error(dst, entries)


def _retry_advice(dst: str, kept: int) -> str:
    """The one command that retries a failed conversion, given what it left in ``dst``."""
    if kept:
        return (f"{kept} completed shards are kept in {dst}: after fixing this, run the same "
                f"command with --resume")
    return f"nothing was left in {dst}: after fixing this, run the same command again"


def _discard_if_empty(dst: str, state) -> None:
    """After a failed run that completed no shard, remove every file it wrote (journal,
    partial shards), so the same command can simply run again (convert() then removes the
    folder if this run created it)."""
    if state is None or state.shards:  # state None: the journal there is not this run's
        return
    clear_outputs(dst)


def _remove_if_empty(dst: str) -> None:
    """Remove the folder ``dst`` if nothing is in it: a failed run that kept no shard (or
    whose engine could not start) leaves no empty folder of its own behind; a finished
    data set is never empty."""
    try:
        os.rmdir(dst)
    except OSError:
        pass


def _other_route(dst, append: bool):
    """What converts into ``dst`` unless it is a new local data set: an append
    (appending.py; upload.py for s3://) or an s3:// DST (upload.py); else None."""
    if not (append or is_remote(dst)):
        return None
    if not is_remote(dst):  # a local append: no storage client imported
        from dlpack_io.packer.appending import convert_append

        return convert_append
    from dlpack_io.packer import upload

    return upload.append_remote if append else upload.convert_remote


def convert(src, dst, *,
            # where the inputs are: class folders under src, or a list, or another format
            list_file=None, labels: bool = True, source_format: str | None = None,
            image_key: str | None = None, label_key: str | None = None, spool=None,
            # what the data set holds (None: PackOptions' default; on append, the data set's)
            format: str | None = None, mode: str | None = None, size: int | None = None,
            max_side: int | None = None, quality: int | None = None, shard_size=None,
            seed: int | None = None, shuffle: bool | None = None, validate: bool | None = None,
            jpeg_restarts: bool | None = None, non_jpeg: str | None = None,
            max_pixels: int | None = None, fields: str | None = None, coco: str | None = None,
            masks: str | None = None, skip_empty: bool | None = None,
            provenance: bool = True,
            # how the run goes
            workers: int | None = None, on_error: str | None = None,
            progress: bool | None = None, resume: bool = False, overwrite: bool = False,
            append: bool = False, replace_changed: bool = False, checksum: bool = False,
            engine: str = "local", ray_address: str | None = None,
            storage_options: dict | None = None, staging=None) -> dict:
    """Pack the images under ``src`` into a data set at ``dst``; return a summary dict.

    ``dlpack convert`` with the same options (docs/convert.md says what each does; the
    defaults of those left None are PackOptions', in packer/options.py). ``list_file`` reads
    ``path,label`` rows instead of scanning class folders; ``labels=False`` packs every
    image under ``src`` with label -1 and no classes; ``source_format``, ``image_key``,
    ``label_key``, ``spool``: a WebDataset tar, Parquet, TFRecord or RecordIO SRC
    (docs/formats.md). ``provenance=False`` leaves the host name and the absolute source
    paths out of the manifest (a data set meant for sharing). ``engine="ray"`` runs the work
    as tasks on a Ray cluster (``ray_address``; none: a private one on this machine) with
    byte-identical output. ``append``: add the inputs not packed yet (``replace_changed``:
    pack changed ones too, retiring their old records; ``checksum``: hash every file, not
    only those whose size or mtime changed). An s3://, gs:// or az:// DST takes
    ``storage_options`` and ``staging`` (where shards wait for upload). Raises
    ConversionError with the file and the fix when the job cannot complete; a run that
    completed no shard leaves nothing behind, so the advice is to run it again.
    """
    given = dict(source_format=source_format, image_key=image_key, label_key=label_key,
                 spool=spool, format=format, mode=mode, size=size, max_side=max_side,
                 quality=quality, shard_size=shard_size, seed=seed, shuffle=shuffle,
                 validate=validate, jpeg_restarts=jpeg_restarts, non_jpeg=non_jpeg,
                 max_pixels=max_pixels, fields=fields, coco=coco, masks=masks,
                 skip_empty=skip_empty, workers=workers, on_error=on_error, progress=progress,
                 storage_options=storage_options, staging=staging)
    options = {k: v for k, v in given.items() if v is not None}  # None: not given
    if not is_remote(dst) and (storage_options is not None or staging is not None):
        raise ValueError(f"{dst}: storage_options and staging (where shards wait for upload) "
                         f"are for s3://, gs://, az:// DSTs")
    if append:
        options.update(replace_changed=replace_changed, checksum=checksum)
    elif replace_changed or checksum:
        raise ValueError("replace_changed and checksum are for an append (append=True)")
    return _convert(src, dst, list_file=list_file, resume=resume, overwrite=overwrite,
                    labels=labels, provenance=provenance, engine=engine,
                    ray_address=ray_address, append=append, **options)


def _convert(src, dst, *, list_file, resume: bool, overwrite: bool, labels: bool,
             provenance: bool, engine: str, ray_address: str | None, append: bool,
             **options) -> dict:
    route = _other_route(dst, append)
    if route is not None:
        return route(
            src, dst, list_file=list_file, resume=resume, overwrite=overwrite, labels=labels,
            provenance=provenance, engine=engine, ray_address=ray_address, **options)
    check_src_dst(src, dst)
    opts, inputs = prepare_inputs(src, list_file, options, labels)
    check_engine_fields(src, engine, inputs)
    engine_ = engine_context(engine, ray_address, opts)
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
            return {"dst": dst, "already_complete": True}
        with engine_ as pack:  # Ray connects here, after the lock and before DST changes
            _prepare_dst(dst, resume, overwrite)
            return _convert_locked(src, dst, inputs, stats, plan, opts, pack, engine,
                                   provenance)
    finally:
        lock.release(remove=True)  # first: the lock file must go for the folder to go
        if created:
            _remove_if_empty(dst)


def _convert_locked(src, dst, inputs, stats, plan, opts, pack, engine, provenance) -> dict:
    """Take over what a resumed run kept, pack the rest, write the manifest; on failure
    leave nothing behind when no shard was completed, and name the one retry command."""
    state = None
    try:
        state = resume_state(dst, plan, inputs, opts)
        resumed_from = state.position  # a resumed run cannot stat what was packed before it
        seen = {} if resumed_from else appendbase.stat_all(inputs)
        progress = pack(dst, inputs, stats, opts, state, journal.Journal(dst))
        manifest = _finish(src, dst, inputs, opts, state, progress, engine, provenance, seen)
    except ConversionError as exc:
        _discard_if_empty(dst, state)
        raise ConversionError(f"{exc}; {_retry_advice(dst, len(state.shards) if state else 0)}") \
            from exc.__cause__
    except BaseException:
        _discard_if_empty(dst, state)
        raise
    return dict(finalize.summary(dst, manifest, state, inputs, progress, resumed_from),
                engine=engine)


def _finish(src, dst, inputs, opts: PackOptions, state: State, progress, engine: str,
            provenance: bool, seen: dict) -> dict:
    """Write the input-stat record (``seen``; none: appendbase.py), rejects.tsv and, last,
    the manifest; drop the journal. Returns the manifest."""
    manifest = finalize.final_manifest(src, inputs, opts, state, progress, engine, provenance)
    try:
        if seen:
            appendbase.write_local(dst, seen, manifest)
        finalize.write_dataset_files(dst, manifest, state.rejects
                                     + finalize.annotation_rejects(inputs))
    except OSError as exc:
        raise ConversionError(f"{dst}: cannot write the manifest ({exc.strerror or exc}); "
                              f"all shards are complete, free space") from exc
    journal.Journal(dst).remove()
    return manifest
