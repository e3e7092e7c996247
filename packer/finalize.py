"""The last step of a conversion: the manifest (built from the packing state), the rejects
file, then the manifest file, atomically; and the summary ``convert`` returns. Also the
files of DST (what may be there before a run, what ``--overwrite`` clears) and what a
resumed run keeps of the interrupted one.
"""
from __future__ import annotations

import datetime
import logging
import os
import platform
import re
from collections import Counter

import numpy as np

from dlpack_io.packer import journal
from dlpack_io.packer.fields import settle_shapes
from dlpack_io.packer.journal import JOURNAL_NAME, JOURNAL_TMP_NAME, LOCK_NAME
from dlpack_io.packer.packing import State, packing_order
from dlpack_io.packer.records import ConversionError
from dlpack_io.packer.scan import clipped, shown
from dlpack_io.packer.targets import annotation_rejects
from dlpack_io.packer.writers import PARTIAL_SUFFIX, create_new, fsync_dir
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.checks import open_regular
from dlpack_io.reader.format.schema import INPUTSTAT_NAME

TMP_INFIX = ".tmp-"  # atomic_write's temp file: PATH.tmp-PID (pid: two writers never collide)


def atomic_write(path, data: bytes) -> None:
    """Write ``data`` to ``path`` via temp file, fsync and rename: all or nothing."""
    tmp = f"{path}{TMP_INFIX}{os.getpid()}"
    try:
        with open(create_new(tmp), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def pil_flavour() -> str:
    """Which PIL is installed: ``pillow-simd X`` or ``pillow X``."""
    from importlib import metadata

    for dist in ("pillow-simd", "Pillow"):
        try:
            return f"{dist.lower()} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    return "PIL (unknown distribution)"


def rejects_tsv(rejects: list) -> bytes:
    """The rejects file: a header line, then ``path<TAB>reason`` per skipped input (and,
    after them, per annotation left out of a packed image: targets.annotation_rejects)."""
    lines = ["path\treason"] + [f"{clipped(p)}\t{clipped(r)}".replace("\n", " ")
                                for p, r in rejects]
    return ("\n".join(lines) + "\n").encode()


def build_manifest(inputs, options, shards: list, rejects: list, reencoded: dict,
                   class_counts: list, seconds: float, lossless: dict | None = None, *,
                   provenance: bool = True, engine: str = "local", fields=None) -> dict:
    """The manifest dict (checksum included) describing a finished data set.

    Only ``created`` (when, where, by which engine) and the checksum over it differ between
    two conversions of the same source with the same options. ``provenance=False`` leaves
    out what identifies the machine that packed it: the host name and the absolute paths
    of the source folder and list file (null instead). ``fields``: the field schema of
    samples that carry more than an image and a label (format 3); None or empty: format 2.
    """
    from dlpack_io.packer.version import __version__

    manifest = {
        "kind": fmt.MANIFEST_KIND, "version": fmt.FORMAT_VERSION if fields else fmt.PLAIN_VERSION,
        "format": options.format, "mode": options.mode,
        "num_samples": sum(s["num_samples"] for s in shards),
        "num_bytes": sum(s["bytes"] for s in shards),
        "classes": list(inputs.classes), "class_counts": list(class_counts),
        "shards": shards, "options": options.output_options(),
        "source": {"root": None if inputs.root is None else shown(inputs.root),
                   "list": None if inputs.list_file is None else shown(inputs.list_file),
                   "num_inputs": len(inputs.paths)},
        "rejects": [{"path": clipped(p), "reason": clipped(r)} for p, r in rejects],
        "reencoded": dict(sorted(reencoded.items())),
        "lossless": dict(sorted((lossless or {}).items())),
        "created": {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    "seconds": round(seconds, 3), "dlpack": __version__, "pil": pil_flavour(),
                    "python": platform.python_version(), "host": platform.node(),
                    "engine": engine},
    }
    if fields:
        manifest["fields"] = fields
    if not provenance:
        manifest["source"].update(root=None, list=None)
        del manifest["created"]["host"]
    manifest["checksum"] = fmt.manifest_checksum(manifest)
    return manifest


def write_dataset_files(dst, manifest: dict, rejects: list) -> None:
    """Write rejects.tsv, then manifest.json last: the manifest's arrival completes DST."""
    data = manifest_bytes(manifest, dst)
    atomic_write(os.path.join(dst, fmt.REJECTS_NAME), rejects_tsv(rejects))
    atomic_write(os.path.join(dst, fmt.MANIFEST_NAME), data)


def manifest_bytes(manifest: dict, dst) -> bytes:
    """The manifest file's bytes; ConversionError when they exceed what a reader takes
    (never a data set its own reader refuses)."""
    data = fmt.encode_meta(manifest)
    if len(data) > fmt.MAX_MANIFEST_BYTES:
        raise ConversionError(
            f"{dst}: the manifest would be {len(data)} bytes, more than the "
            f"{fmt.MAX_MANIFEST_BYTES} a reader takes ({len(manifest['rejects'])} rejects, "
            f"{len(manifest['classes'])} classes, {len(manifest['shards'])} shards); no "
            f"manifest was written: fix or leave out the rejected inputs, or pack fewer classes "
            f"or larger shards")
    return data


def final_manifest(src, inputs, opts, state, progress, engine: str, provenance: bool) -> dict:
    """The finished data set's manifest from the packing ``state`` (packing.State) and
    ``opts`` (PackOptions); ConversionError (naming ``src`` and the most common reasons)
    when not one input could be packed."""
    if not state.shards:
        reasons = Counter(r for _, r in state.rejects).most_common(3)
        raise ConversionError(f"{src}: none of the {len(inputs.paths)} inputs could be "
                              f"packed; most common reasons: "
                              + "; ".join(f"{why} ({n}x)" for why, n in reasons))
    manifest = build_manifest(inputs, opts, state.shards, state.rejects, state.reencoded,
                              state.class_counts.tolist(), progress.elapsed, state.lossless,
                              provenance=provenance, engine=engine,
                              fields=settle_shapes(getattr(inputs, "fields", None), state.shapes))
    problem = fmt.accounting_problem(manifest)
    if problem:  # never a data set with an input silently gone
        raise ConversionError(f"{src}: {problem} (the packing state does not add up: a "
                              f"damaged or edited journal?); no manifest was written")
    return manifest


def summary(dst, manifest, state, inputs, progress, resumed_from) -> dict:
    """What ``convert`` returns (and ``dlpack convert`` prints): counts, rates, and what
    the scan found along the way. ``num_samples`` is the data set's; ``run_samples`` (and
    the rates over ``seconds``) this run's, which differ after --resume and --append."""
    empty = [c for c, n in zip(manifest["classes"], manifest["class_counts"]) if n == 0]
    seconds = progress.elapsed
    return {"dst": dst, "num_samples": manifest["num_samples"], "num_shards": len(state.shards),
            "num_bytes": manifest["num_bytes"], "rejects": len(state.rejects),
            "annotation_rejects": len(annotation_rejects(inputs)),
            "reencoded": dict(state.reencoded), "lossless": dict(state.lossless),
            "ignored": dict(inputs.ignored or {}), "resumed_from": resumed_from,
            "seconds": seconds, "run_samples": progress.packed,
            "images_per_s": progress.packed / max(seconds, 1e-9),  # one clock reading for all
            "mb_per_s": progress.bytes / 1e6 / max(seconds, 1e-9), "empty_classes": empty,
            "via_links": inputs.via_links, "outside_src": inputs.outside_src,
            "repeated_dirs": inputs.repeated_dirs, "hidden_files": inputs.hidden_files,
            "hidden_dirs": inputs.hidden_dirs, "mode": manifest["mode"],
            "size": manifest["options"].get("size"),
            "max_side": manifest["options"].get("max_side"), "fields": manifest.get("fields", {}),
            "sidecars": dict(getattr(inputs, "sidecars", None) or {})}



# ---- the files of DST ------------------------------------------------------------------------
# What a conversion may find, keep and delete in its destination folder.
#
# Only files this tool writes are ever deleted: shards, their partial temp files, the
# manifest, the rejects file and temp files of atomic writes. Anything else is left alone.
def _either(*names: str) -> str:
    return "(" + "|".join(re.escape(n) for n in names) + ")"


# Built from the names' owners (format, writers, finalize, journal) so that a renamed file
# can never be left out of what a cleanup may delete. ("shard-NNNNN" is fmt.shard_name's.)
_OURS = re.compile(rf"^(\.?shard-\d{{5,}}{_either(*fmt.SHARD_SUFFIX.values())}"
                   rf"({re.escape(PARTIAL_SUFFIX)})?"
                   rf"|{_either(fmt.MANIFEST_NAME, fmt.REJECTS_NAME, INPUTSTAT_NAME)}({re.escape(TMP_INFIX)}\d+)?"
                   rf"|{_either(JOURNAL_NAME, JOURNAL_TMP_NAME)})$")


def not_empty_error(where: str, names) -> ConversionError:
    """The refusal to convert into a non-empty destination (a folder or an s3:// prefix)
    without --resume or --overwrite, naming a few of the ``names`` found there."""
    return ConversionError(f"{where} is not empty ({', '.join(sorted(names)[:3])}...); pass "
                           f"--resume to finish an interrupted conversion or --overwrite "
                           f"to replace what is there")


def existing_entries(dst) -> list[str]:
    """Names in ``dst`` other than our lock file (the folder need not exist)."""
    try:
        return [n for n in os.listdir(dst) if n != LOCK_NAME]
    except FileNotFoundError:
        return []


def clear_outputs(dst, keep=frozenset()) -> list[str]:
    """Delete our files in ``dst`` except the shards named in ``keep`` and the journal
    (when anything is kept); return the names deleted."""
    removed = []
    for name in existing_entries(dst):
        if not _OURS.match(name) or name in keep or (keep and name == JOURNAL_NAME):
            continue
        os.unlink(os.path.join(dst, name))
        removed.append(name)
    return removed


def verify_kept_shard(dst, entry: dict) -> bool:
    """Cheap check that a journaled shard is still the file we wrote: its size, and the
    CRC the manifest will carry (record shards: of the header; LMDB shards: of the
    metadata value, read after the B-tree was checked). Record bytes are not re-read."""
    path = os.path.join(dst, entry["name"])
    try:
        size = os.path.getsize(path)
        if size != entry["bytes"]:
            return False
        if entry["name"].endswith(fmt.SHARD_SUFFIX["record"]):
            fd, _ = open_regular(path)  # a FIFO in DST must not block us under its lock
            with open(fd, "rb") as f:
                header = fmt.unpack_header(f.read(fmt.HEADER_SIZE), size, path)
            return header.header_crc == entry["crc"]
        meta = _lmdb_meta(path)
        return meta is not None and fmt.crc32(meta) == entry["crc"]
    except (OSError, fmt.FormatError):
        return False


def kept_shard_paths(dst, entry: dict) -> list | None:
    """The source paths a kept shard's own metadata lists (checked against its CRC), or
    None when they cannot be read: what a journal line's accounting is compared with."""
    meta = kept_shard_meta(dst, entry)
    paths = None if meta is None else meta.get("paths")
    return paths if isinstance(paths, list) else None


def kept_shard_meta(dst, entry: dict) -> dict | None:
    """A shard's own metadata dict (checked against its CRC), or None when it cannot be
    read (record shards: the header's metadata CRC; LMDB: the B-tree checked first)."""
    path = os.path.join(dst, entry["name"])
    try:
        if entry["name"].endswith(fmt.SHARD_SUFFIX["record"]):
            fd, st = open_regular(path)  # a FIFO in DST must not block us under its lock
            with open(fd, "rb") as f:
                size = st.st_size
                header = fmt.unpack_header(f.read(fmt.HEADER_SIZE), size, path)
                meta = os.pread(f.fileno(), header.meta_size, header.meta_offset)
            if fmt.crc32(meta) != header.meta_crc:
                return None
        else:
            meta = _lmdb_meta(path)
        return None if meta is None else fmt.decode_json(meta, path)
    except (OSError, fmt.FormatError):
        return None


def _lmdb_meta(path: str):
    """An LMDB shard's metadata value (None if it has none); FormatError when its
    structure is damaged (checked before liblmdb reads it)."""
    import lmdb

    from dlpack_io.reader.format.checks import check_lmdb

    check_lmdb(path)
    try:
        env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False,
                        max_readers=1)
    except lmdb.Error:
        return None
    try:
        with env.begin(buffers=False) as txn:
            meta = txn.get(fmt.LMDB_META_KEY)
    except lmdb.Error:
        return None
    finally:
        env.close()
    return meta


def check_src_dst(src, dst) -> None:
    """Refuse a DST that is SRC, lies inside SRC, or contains SRC (after resolving links).

    Packing into the source tree makes the next conversion of SRC find the data set as an
    extra class; packing over the source lets --overwrite delete what it reads.
    """
    s, d = os.path.realpath(src), os.path.realpath(dst)
    if d == s:
        why = "DST is the source folder itself"
    elif d.startswith(s.rstrip(os.sep) + os.sep):
        why = (f"DST lies inside the source folder ({s}): the next conversion of SRC would "
               f"pack the data set's own files as an extra class")
    elif s.startswith(d.rstrip(os.sep) + os.sep):
        why = f"the source folder lies inside DST ({d}): --overwrite would delete the inputs"
    else:
        return
    raise ConversionError(f"{dst}: {why}; choose a DST outside SRC (for example next to it)")



# ---- what a resumed run keeps ----------------------------------------------------------------
# What a resumed conversion (or append) keeps: the journaled shards that are still the
# files that were written and whose journal lines add up; everything after the first that
# does not is redone (conversion.py and appending.py share it).
log = logging.getLogger(__name__)


def resume_state(dst: str, plan: dict, inputs, opts, state: State | None = None,
                 keep=frozenset()) -> State:
    """The packing State after taking over what DST's journal vouches for (none: a fresh
    start from ``state``, an empty one by default; an append passes the data set's shards
    so that new shards are numbered after them). Deletes our files in DST but the kept
    shards, ``state``'s shards and the names in ``keep``; rewrites the journal."""
    if state is None:
        state = State(class_counts=np.zeros(len(inputs.classes), dtype=np.int64))
    old_plan, done = journal.read_journal(dst)
    refused = journal.refusal(dst, old_plan, plan) if old_plan is not None else None
    if refused:
        raise ConversionError(refused)
    order = packing_order(len(inputs.paths), opts)
    for entry in journal.accounted(done, old_plan, len(inputs.classes), dst) \
            if old_plan else []:
        if not verify_kept_shard(dst, entry["shard"]):
            log.warning("shard %s from the interrupted run is damaged; redoing from there",
                        entry["shard"]["name"])
            break
        covered = [shown(inputs.paths[i])
                   for i in order[state.position:entry["end_input"]].tolist()]
        problem = journal.paths_problem(entry, covered,
                                           kept_shard_paths(dst, entry["shard"]))
        if problem:
            log.warning("%s: the journal line of shard %s disagrees with the shard (%s); "
                        "redoing from there", dst, entry["shard"]["name"], problem)
            break
        state.take_over(entry)
    kept = {s["name"] for s in state.shards}
    clear_outputs(dst, keep=kept | set(keep))
    journal.Journal(dst, plan, [e for e in done if e["shard"]["name"] in kept])
    return state
