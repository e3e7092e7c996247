"""``convert(src, dst, append=True)`` (``dlpack convert SRC DST --append``): pack only the
inputs of SRC that are not yet in the data set at DST into new shards numbered after its
own, then write a new manifest (atomically: temp, fsync, rename) listing the old shards
unchanged plus the new ones.

Old shard files are never opened for writing, so a reader that opened the old manifest
keeps reading what it knew; one that opens DST after the rename sees the union. New class
folders get class indices after the old ones. The journal, the lock and ``--resume`` are
the conversion's (packer/journal.py, finalize.py); the journal's plan line names the
manifest appended to (its checksum) and the first new sample, so an interrupted append
resumes only onto the same data set. Which inputs are new: packer/appendbase.py.
"""
from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np

from dlpack_io.packer import appendbase, finalize, journal
from dlpack_io.packer.engines import engine_context
from dlpack_io.packer.fields import check_engine_fields, settle_shapes, union_schema
from dlpack_io.packer.finalize import check_src_dst, clear_outputs, resume_state
from dlpack_io.packer.packing import State, plan_inputs, prepare_inputs
from dlpack_io.packer.records import ConversionError
from dlpack_io.packer.scan import shown
from dlpack_io.reader import format as fmt

log = logging.getLogger(__name__)
CHANGED_SHOWN = 20  # changed paths named in the summary (all are counted)


@dataclasses.dataclass
class Appending:
    """An append planned: options, the inputs to pack (classes: the union), their plan."""

    opts: object
    inputs: object
    stats: list
    plan: dict
    split: appendbase.Split
    new_classes: list
    seen: int  # inputs found in SRC
    replaced: list = dataclasses.field(default_factory=list)  # paths whose record was retired
    retried: frozenset = frozenset()  # rejected paths of the data set packed (or not) again
    dropped: int = 0  # the data set's reject entries of those paths (no longer listed)


def convert_append(src, dst, *, list_file=None, resume: bool = False, overwrite: bool = False,
                   labels: bool = True, provenance: bool = True, engine: str = "local",
                   ray_address=None, replace_changed: bool = False, checksum: bool = False,
                   **options) -> dict:
    """Append the inputs of ``src`` not yet in the data set at ``dst``; the summary dict
    of convert() plus ``append`` (what was added, skipped and reported). ``checksum``:
    hash every packed file of SRC, not only those whose size or mtime changed
    (appendbase.py). ``replace_changed``: pack the changed inputs too, retiring their old
    records (packer/appendbase.py)."""
    check_request(dst, overwrite)
    check_src_dst(src, dst)
    dst = os.path.abspath(dst)
    appendbase.read_base(dst)  # no data set there: say so before taking the lock
    lock = journal.DstLock(dst)
    try:
        lock.acquire()
    except OSError as exc:
        raise ConversionError(f"{dst}: cannot write the data set's folder "
                              f"({exc.strerror or exc}); appending needs write access") from None
    try:
        base = appendbase.read_base(dst)  # under the lock: another append may have just landed
        check_no_journal(dst, journal.read_journal(dst)[0], resume)
        metas = appendbase.shard_metas(dst, base["shards"])
        app = plan_append(src, list_file, labels, options, base, metas,
                          None if checksum else appendbase.read_local(dst, base),
                          replace_changed)
        check_engine_fields(src, engine, app.inputs)
        if not app.inputs.paths:
            drop_leftovers(dst, base)
            appendbase.write_local(dst, app.split.stats, base)  # what was hashed, for next time
            return nothing_new(dst, base, app)
        with engine_context(engine, ray_address, app.opts) as pack:
            return _append_locked(dst, base, app, pack, engine, provenance)
    finally:
        lock.release(remove=True)


def drop_leftovers(dst: str, base: dict) -> None:
    """Nothing new, yet a journal (``--resume``): the append it belongs to was killed after
    its manifest landed; drop the journal and any file the manifest does not list."""
    if journal.read_journal(dst)[0] is None:
        return
    clear_outputs(dst, keep={s["name"] for s in base["shards"]}
                  | {fmt.MANIFEST_NAME, fmt.REJECTS_NAME, appendbase.NAME})
    journal.Journal(dst).remove()


def check_request(dst, overwrite: bool) -> None:
    """Refuse what an append cannot do (both destinations, before anything is read)."""
    if overwrite:
        raise ConversionError(f"{dst}: --append adds to the data set there and --overwrite "
                              f"replaces it; use one or the other")


def check_no_journal(where: str, plan, resume: bool) -> None:
    """Refuse to start over an interrupted append (or conversion) without ``--resume``."""
    if plan is not None and not resume:
        raise ConversionError(f"{where}: an interrupted append left its journal there; pass "
                              f"--resume (with the same SRC) to finish it")


def plan_append(src, list_file, labels: bool, options: dict, base: dict, metas,
                recorded: dict | None = None, replace: bool = False) -> Appending:
    """Scan ``src`` with the data set's options, find what is new (``metas``: (shard
    entry, its metadata) of the data set; ``recorded``: the input-stat record, None to
    hash every packed file; ``replace``: changed inputs are packed to replace their
    records) and plan packing it."""
    opts, inputs = prepare_inputs(src, list_file, appendbase.append_options(base, options),
                                  labels and bool(base["classes"]))
    if base["classes"] and not inputs.classes:
        raise ConversionError(f"{src}: no class folders, but the data set has classes; append "
                              f"class folders (or a --list with labels)")
    appendbase.check_fields(base, inputs.fields, src)
    retired = fmt.retired_records(fmt.retired_pairs(base))
    known = appendbase.known_inputs(metas, retired)
    split = appendbase.split_inputs(inputs.root, inputs.paths, known, opts.num_workers, recorded,
                               replace, appendbase.path_records(metas, retired) if replace else None,
                               inputs.members)
    for path in split.changed[:CHANGED_SHOWN]:
        log.warning("%s: changed since it was packed (same path, other content); %s", path,
                    "packed again to replace it" if replace else "left as it is")
    union, mapping = appendbase.union_classes(base["classes"], inputs.classes)
    sub = subset(inputs, split.todo, union, mapping)
    stats, plan = plan_inputs(sub, opts) if sub.paths else ([], {})
    if sub.paths:  # the plan names what it appends to: resume only onto the same data set
        plan = journal.plan_line(sub, stats, dict(opts.output_options(),
                                                  append_to=base["checksum"]),
                                 fmt.FORMAT_VERSION)
        plan["first_sample"] = base["num_samples"]
    retried = retried_paths(base, sub.paths)
    return Appending(opts, sub, stats, plan, split, union[len(base["classes"]):],
                     len(inputs.paths), retried=retried,
                     dropped=sum(r["path"] in retried for r in base["rejects"]))


def retried_paths(base: dict, todo_paths: list) -> frozenset:
    """The paths the data set lists as rejects that this append tries again: their old
    reject is dropped, and this run's outcome (a record, or a new reject) takes its place, so
    a reject fixed in SRC (a sidecar added, a file repaired) stops being reported."""
    rejected = {r["path"] for r in base["rejects"]}
    return frozenset(rejected.intersection(shown(p) for p in todo_paths))


def subset(inputs, todo: list, classes: list, mapping: list):
    """``inputs`` restricted to input numbers ``todo``, labelled in ``classes`` (the
    union; ``mapping``: union index of each of inputs.classes)."""
    def label(i):
        old = inputs.labels[i]
        return mapping[old] if 0 <= old < len(mapping) else old
    renumber = {i: k for k, i in enumerate(todo)}
    return dataclasses.replace(
        inputs, paths=[inputs.paths[i] for i in todo], labels=[label(i) for i in todo],
        classes=list(classes), empty_classes=(),
        bad={renumber[i]: why for i, why in inputs.bad.items() if i in renumber}
        if inputs.bad else inputs.bad,
        field_values=None if inputs.field_values is None
        else [inputs.field_values[i] for i in todo])


def seeded_state(base: dict, num_classes: int, retried=frozenset()) -> State:
    """The packing State of an append before it packs: the data set's shards (new ones are
    numbered after them), rejects (less those ``retried``: Appending.retried) and counts."""
    rejects, reencoded, lossless = appendbase.base_counters(base)
    rejects = [r for r in rejects if r[0] not in retried]
    counts = np.zeros(num_classes, dtype=np.int64)
    counts[:len(base["class_counts"])] = base["class_counts"]
    return State(shards=list(base["shards"]), rejects=rejects, reencoded=reencoded,
                 lossless=lossless, class_counts=counts)


def _append_locked(dst: str, base: dict, app: Appending, pack, engine: str,
                   provenance: bool) -> dict:
    keep = {s["name"] for s in base["shards"]} | {fmt.MANIFEST_NAME, fmt.REJECTS_NAME,
                                                   appendbase.NAME}
    state = None
    try:
        state = resume_state(dst, app.plan, app.inputs, app.opts,
                             seeded_state(base, len(app.inputs.classes), app.retried), keep)
        resumed_from = state.position
        progress = pack(dst, app.inputs, app.stats, app.opts, state, journal.Journal(dst))
        manifest = union_of(base, app, state, progress, engine, provenance)
        appendbase.write_local(dst, record_of(app, resumed_from), manifest)
        finalize.write_dataset_files(dst, manifest, state.rejects)
    except BaseException as exc:
        if state is None or len(state.shards) == len(base["shards"]) or \
                isinstance(exc, appendbase.PairingError):  # nothing worth resuming
            clear_outputs(dst, keep=keep)  # no new shard: leave the data set as it was
            journal.Journal(dst).remove()
        raise
    journal.Journal(dst).remove()
    return append_summary(dst, manifest, state, app, progress, resumed_from, engine)


def record_of(app: Appending, resumed_from) -> dict:
    """The input-stat record after the append: a resumed append did not stat the inputs
    its killed run packed before reading them, so it records none of its new inputs. A
    changed input is recorded only once its record is replaced (one the encoder rejected
    stays changed for the next append)."""
    if not resumed_from:
        return dict(app.split.stats, **{k: app.split.pending[k] for k in app.replaced
                                         if k in app.split.pending})
    new = {shown(p) for p in app.inputs.paths}
    return {k: v for k, v in app.split.stats.items() if k not in new}


def union_of(base: dict, app: Appending, state: State, progress, engine: str,
             provenance: bool) -> dict:
    """The manifest after the append (history entry included)."""
    new = state.shards[len(base["shards"]):]
    pairs, app.replaced = appendbase.replacements(
        base, app.inputs, app.opts, app.split.replacing, app.split.todo,
        state.rejects[len(base["rejects"]) - app.dropped:],
        sum(s["num_samples"] for s in new))
    root = shown(app.inputs.root) if provenance and app.inputs.root else None
    entry = appendbase.history_entry(base, new, app.new_classes, split_counts(app), root)
    fields = union_schema(base.get("fields"),
                          settle_shapes(getattr(app.inputs, "fields", None), state.shapes))
    built = finalize.build_manifest(app.inputs, app.opts, state.shards, state.rejects,
                                    state.reencoded, state.class_counts.tolist(),
                                    progress.elapsed, state.lossless, provenance=provenance,
                                    engine=engine, fields=fields)
    return appendbase.union_manifest(base, built, entry, pairs)


def split_counts(app: Appending) -> dict:
    """The counts of the history entry: inputs packed or rejected, and those skipped."""
    return {"inputs": len(app.inputs.paths), "duplicates": app.split.duplicates,
            "changed": len(app.split.changed), "unverified": app.split.unverified,
            "replaced": len(app.replaced), "retried": app.dropped}


def check_counts(app: Appending) -> dict:
    """How the duplicates were found: by size + mtime (``quick``) or by hashing."""
    return {"quick": app.split.quick, "hashed": app.split.hashed}


def append_report(base: dict, app: Appending, new_shards: list) -> dict:
    """The ``append`` part of the summary: what was added, skipped and reported."""
    return {"base_samples": visible(base), "base_shards": len(base["shards"]),
            "seen": app.seen, "new_samples": sum(s["num_samples"] for s in new_shards),
            "new_shards": [s["name"] for s in new_shards], "new_classes": app.new_classes,
            "changed_paths": app.split.changed[:CHANGED_SHOWN],
            "replaced_paths": app.replaced[:CHANGED_SHOWN], **split_counts(app),
            **check_counts(app)}


def append_summary(dst, manifest, state, app: Appending, progress, resumed_from,
                   engine: str) -> dict:
    """convert()'s summary of the union, plus what this append did."""
    first = manifest[fmt.HISTORY_KEY][-1]["first_sample"]
    base = {"num_samples": first,
            "shards": state.shards[:len(state.shards)
                                   - len(manifest[fmt.HISTORY_KEY][-1]["shards"])],
            fmt.RETIRED_KEY: [p for p in fmt.retired_pairs(manifest) if p[1] < first]}
    summary = finalize.summary(dst, manifest, state, app.inputs, progress, resumed_from)
    return dict(summary, engine=engine, num_samples=visible(manifest),
                num_records=manifest["num_samples"],
                retired=len(fmt.retired_pairs(manifest)),
                append=append_report(base, app, state.shards[len(base["shards"]):]))


def visible(manifest: dict) -> int:
    """The samples a reader of ``manifest`` sees: its records less those retired."""
    return manifest["num_samples"] - len(fmt.retired_pairs(manifest))


def nothing_new(dst, base: dict, app: Appending) -> dict:
    """The summary of an append that found nothing to pack: the data set is unchanged."""
    log.info("%s: nothing new to append (%d duplicates, %d changed, %d unverified)", dst,
             app.split.duplicates, len(app.split.changed), app.split.unverified)
    return {"dst": dst, "num_samples": visible(base), "num_shards": len(base["shards"]),
            "num_bytes": base["num_bytes"], "rejects": len(base["rejects"]),
            "nothing_new": True, "append": append_report(base, app, [])}
