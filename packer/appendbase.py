"""The data set an append adds to (``convert(..., append=True)`` and ``Writer(dst,
append=True)`` share it): its manifest, the identity of every input already packed (source
path + SHA-256 of the file, from each shard's metadata), which inputs of a new source are
new, duplicates or changed, the union of the classes, the history entry and the union
manifest (old shard entries unchanged, new ones after them).

Identity: two inputs are the same when their paths (as recorded: relative to SRC,
escaped like the shard metadata) and the SHA-256 of their files are equal. Shards packed
before the hash was recorded (``"sources"`` missing from their metadata) identify their
inputs by path only: such a path is skipped as ``unverified`` (it is there; whether its
content changed cannot be told without the original file).
"""
from __future__ import annotations

import datetime
import hashlib
import logging
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field

from dlpack_io.packer.fields import without_shapes
from dlpack_io.packer.finalize import atomic_write, kept_shard_meta
from dlpack_io.packer.options import PackOptions
from dlpack_io.packer.packing import packing_order
from dlpack_io.packer.records import ConversionError
from dlpack_io.packer.scan import shown
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format import schema as schema_mod
from dlpack_io.reader.format.checks import open_input, open_regular
from dlpack_io.reader.format.spec import parse_size

RUN_OPTIONS = ("workers", "on_error", "progress")  # how the work runs, not what it writes
HASH_CHUNK = 4 * 2**20


def read_base(dst: str) -> dict:
    """The validated manifest of the data set in local folder ``dst``; ConversionError
    naming the folder when there is none to append to (or it is damaged)."""
    path = os.path.join(dst, fmt.MANIFEST_NAME)
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        raise ConversionError(f"{dst}: no {fmt.MANIFEST_NAME}, so no data set to append to; "
                              f"convert SRC into it without --append first") from None
    except fmt.FormatError as exc:
        raise ConversionError(str(exc)) from None
    with open(fd, "rb") as f:
        if st.st_size > fmt.MAX_MANIFEST_BYTES:
            raise ConversionError(f"{path}: {st.st_size} bytes, more than a manifest may have "
                                  f"({fmt.MAX_MANIFEST_BYTES}); not a data set of ours")
        return parse_base(f.read(fmt.MAX_MANIFEST_BYTES + 1), path)


def parse_base(data: bytes, where: str) -> dict:
    """Decode and validate a base manifest's bytes (ConversionError naming ``where``)."""
    try:
        return fmt.validate_manifest(fmt.decode_json(data, where), where)
    except fmt.FormatError as exc:
        raise ConversionError(f"{exc}; run 'dlpack verify' on it, or convert again") from None


def shard_metas(dst: str, shards: list) -> list:
    """(shard entry, its metadata or None) of every shard of the data set at ``dst``.

    py-lmdb refuses to open an LMDB file twice in one process, so the shards a Dataset of
    this process holds open are read again by one fresh (spawned) process."""
    metas = [kept_shard_meta(dst, s) for s in shards]
    again = [s for s, m in zip(shards, metas) if m is None and
             s["name"].endswith(fmt.SHARD_SUFFIX["lmdb"])]
    if again:
        import multiprocessing

        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            found = dict(zip([s["name"] for s in again],
                             pool.map(kept_shard_meta, [dst] * len(again), again)))
        metas = [found.get(s["name"], m) for s, m in zip(shards, metas)]
    return list(zip(shards, metas))


def known_inputs(metas, retired=frozenset()) -> dict:
    """path -> {SHA-256 or None: global record number} of every packed input, from
    ``metas``: (shard entry, shard metadata dict or None) pairs in manifest order; the
    ``retired`` records (replaced by a later append: fmt.retired_records) are left out."""
    known: dict = {}
    for entry, meta in metas:
        paths = meta.get("paths") if isinstance(meta, dict) else None
        if not isinstance(paths, list) or len(paths) != entry["num_samples"]:
            raise ConversionError(f"shard {entry['name']}: its metadata (source paths) cannot "
                                  f"be read or does not match the manifest; run 'dlpack "
                                  f"verify' on the data set before appending to it")
        sources = fmt.sources_of(meta, len(paths)) or [None] * len(paths)
        for k, (path, sha) in enumerate(zip(paths, sources)):
            if entry["first_sample"] + k not in retired:
                known.setdefault(str(path), {})[sha] = entry["first_sample"] + k
    return known


def path_records(metas, retired=frozenset()) -> dict:
    """path -> the live record numbers packed from it, in record order (a list may name a
    path on several lines: one record each), from ``metas`` checked by known_inputs."""
    records: dict = {}
    for entry, meta in metas:
        for k, path in enumerate(meta["paths"]):
            if entry["first_sample"] + k not in retired:
                records.setdefault(str(path), []).append(entry["first_sample"] + k)
    return records


def file_sha256(path: str) -> str | None:
    """SHA-256 (hex) of a file, None when it cannot be read (the encoder then says why)."""
    h = hashlib.sha256()
    try:
        fd, _ = open_input(path)  # a FIFO or a device: unread (the encoder says why)
        with open(fd, "rb") as f:  # (hashlib.file_digest is Python 3.11+)
            while chunk := f.read(HASH_CHUNK):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def files_sha256(paths: list) -> list:
    """file_sha256 of each of ``paths`` (one task's share: one future per file would cost
    more than hashing a small JPEG)."""
    return [file_sha256(p) for p in paths]


@dataclass
class Split:
    """What an append does with each input of SRC."""

    todo: list = field(default_factory=list)        # input numbers to pack
    duplicates: int = 0                             # same path, same content: skipped
    changed: list = field(default_factory=list)     # same path, other content: reported
    replacing: dict = field(default_factory=dict)   # of them, packed: input -> record retired
    pending: dict = field(default_factory=dict)     # their stats: recorded once replaced
    unverified: int = 0                             # path packed without a hash: skipped
    quick: int = 0                                  # of the duplicates: by size + mtime
    hashed: int = 0                                 # files read and hashed
    stats: dict = field(default_factory=dict)       # the next input-stat record


def split_inputs(root: str, paths: list, known: dict, threads: int,
                 recorded: dict | None = None, replace: bool = False,
                 records: dict | None = None, members=None) -> Split:
    """Sort ``paths`` (relative to ``root``) into new, duplicate, changed, unverified; the
    files whose path is already packed are hashed (``threads`` at a time) unless their
    size and mtime are those ``recorded`` (``quick_duplicates``, below; None: hash them all).
    ``replace`` (``--replace-changed``): a changed input is packed too, to replace a record
    of its path (``Split.replacing``; ``records``: path_records, else the last record).
    ``members``: inputs inside containers (records.Members), stat'ed and hashed there."""
    split, candidates = Split(), []
    keys = [shown(path) for path in paths]
    for i, key in enumerate(keys):
        hashes = known.get(key)
        if hashes is None:
            split.todo.append(i)
        elif None in hashes:
            split.unverified += 1
        else:
            candidates.append(i)
    looked = candidates + split.todo  # stat before any byte is read (hashed or packed)
    now = stat_inputs(root, [paths[i] for i in looked], [keys[i] for i in looked]) \
        if members is None else {keys[i]: members.stat(paths[i]) for i in looked
                                 if paths[i] in members.table}
    quick = quick_duplicates(candidates, keys, recorded, now)
    candidates = [i for i in candidates if i not in quick]
    shas = hash_files([os.path.join(root, paths[i]) for i in candidates], threads) \
        if members is None else [hashlib.sha256(members.read(paths[i])).hexdigest()
                                 for i in candidates]
    split.stats = dict(recorded or {})
    split.quick, split.duplicates, split.hashed = len(quick), len(quick), len(candidates)
    _sort_hashed(split, zip(candidates, shas), keys, known, now, replace, records or {})
    split.stats.update((keys[i], now[keys[i]]) for i in split.todo
                       if keys[i] in now and i not in split.replacing)
    split.pending = {keys[i]: now[keys[i]] for i in split.replacing if keys[i] in now}
    split.stats = {k: v for k, v in split.stats.items() if v is not None}
    split.todo.sort()
    return split


def hash_files(files: list, threads: int) -> list:
    """file_sha256 of each of ``files``, ``threads`` at a time (hashlib releases the GIL)."""
    step = max(1, -(-len(files) // (4 * max(1, threads))))
    with ThreadPoolExecutor(max(1, threads)) as pool:
        return [sha for part in pool.map(files_sha256, [files[k:k + step] for k in
                                                         range(0, len(files), step)])
                for sha in part]


def union_classes(old: list, new: list) -> tuple[list, list]:
    """(old classes + the names of ``new`` not among them, in ``new``'s order; the union
    index of each class of ``new``): old labels are never renumbered."""
    union = list(old)
    position = {name: k for k, name in enumerate(union)}
    for name in new:
        if name not in position:
            position[name] = len(union)
            union.append(name)
    return union, [position[name] for name in new]


def append_options(base: dict, given: dict) -> dict:
    """PackOptions keywords of an append: the data set's own output options (its shards
    must match), plus the run options in ``given``; ConversionError naming the option
    when ``given`` asks for another value than the data set was packed with."""
    names = set(PackOptions.__dataclass_fields__)
    out = {k: v for k, v in base["options"].items() if k in names and k not in RUN_OPTIONS}
    for key, value in given.items():
        if value is None:  # not given: the data set's value
            continue
        if key == "shard_size" and isinstance(value, str):
            value = parse_size(value)
        if key not in RUN_OPTIONS and key in out and out[key] != value:
            raise ConversionError(f"{key}={value!r}, but the data set was packed with "
                                  f"{key}={out[key]!r}: an append writes shards like the old "
                                  f"ones; leave {key} out (its manifest's value is used)")
        out[key] = value
    return out


def check_fields(base: dict, fields, where: str) -> None:
    """Refuse new samples whose field schema is not the data set's."""
    if without_shapes(base.get("fields")) != without_shapes(fields):
        raise ConversionError(f"{where}: the new samples carry fields {sorted(fields or {})} "
                              f"but the data set has {sorted(base.get('fields') or {})} (with "
                              f"their types): an append must give every sample the same "
                              f"fields; use --fields to choose them")


def _sort_hashed(split: Split, hashed, keys: list, known: dict, now: dict,
                 replace: bool, records: dict) -> None:
    """Sort the (input number, SHA-256 or None) of ``hashed`` into ``split``: to pack
    (unreadable: the encoder says why), duplicate or changed; with ``replace`` the k-th
    changed input of a path replaces the k-th live record of that path (``records``), and
    one beyond them none (no record is retired twice: readers refuse such a manifest)."""
    used: dict = {}
    for i, sha in hashed:
        if sha is None:
            split.todo.append(i)  # unreadable now: the encoder rejects it, naming why
        elif sha in known[keys[i]]:
            split.duplicates += 1
            split.stats[keys[i]] = now.get(keys[i])
        else:
            split.changed.append(keys[i])  # its record (if any) stays the packed file's
            live = records.get(keys[i]) or list(known[keys[i]].values())
            k = used.get(keys[i], 0)
            if replace and len(known[keys[i]]) == 1 and k < len(live):
                used[keys[i]] = k + 1
                split.replacing[i] = live[k]
                split.todo.append(i)


def history_entry(base: dict, new_shards: list, new_classes: list, split_counts: dict,
                  source: str | None) -> dict:
    """One append in the manifest's history: when, from where, what it saw and wrote."""
    return {"at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "source": source, "first_sample": base["num_samples"],
            "num_samples": sum(s["num_samples"] for s in new_shards),
            "shards": [s["name"] for s in new_shards], "new_classes": list(new_classes),
            **split_counts}


def union_manifest(base: dict, built: dict, entry: dict, retire: list = ()) -> dict:
    """The manifest after an append: ``built`` (finalize.build_manifest over all shards,
    classes, counts and rejects) keeping the data set's creation record, options and
    source, with the inputs counted, ``entry`` added to the history and the data set's
    retired records plus ``retire`` ([old, new] pairs: the replacing section below)."""
    manifest = with_retired(
        dict(built, created=base["created"], options=base["options"],
             version=base["version"], source=dict(base["source"])), base, list(retire))
    if "num_inputs" in base["source"]:
        manifest["source"]["num_inputs"] = base["source"]["num_inputs"] + entry["inputs"] \
            - entry.get("retried", 0)  # counted once already, as rejects of an earlier run
    manifest[fmt.HISTORY_KEY] = list(base.get(fmt.HISTORY_KEY, [])) + [entry]
    manifest.pop("checksum", None)
    manifest["checksum"] = fmt.manifest_checksum(manifest)
    problem = fmt.accounting_problem(manifest)
    if problem:
        raise ConversionError(f"{problem} (the data set's and the append's counts do not add "
                              f"up); no manifest was written")
    return manifest


def base_counters(base: dict) -> tuple[list, Counter, Counter]:
    """(rejects as (path, reason), reencoded, lossless) of the data set: where the union
    manifest's accounting starts."""
    rejects = [(r["path"], r["reason"]) for r in base["rejects"]]
    return rejects, Counter(base["reencoded"]), Counter(base["lossless"])



# ---- the quick check: inputs unchanged by size and mtime -------------------------------------
# rsync's quick check for ``convert --append``: an input whose path is packed already and
# whose file has the size and mtime (ns) recorded when it was packed counts as a duplicate
# without being read; only new or changed-looking files are hashed. ``--checksum`` (rsync's
# ``-c``) hashes every file instead.
#
# The trade-off is rsync's, exactly: a file rewritten with other content of the same size
# whose mtime was then set back (``os.utime``, ``touch -d``, ``cp -p`` of another file, a
# clock jump) is taken as unchanged without --checksum. A file touched with the same content
# (new mtime) is hashed, found a duplicate, and its new stat recorded.
#
# The record (reader/format/schema.py) is written before the manifest, naming it; the
# stat of a file is taken before its bytes are read (hashed or packed), so a file changed
# while it is packed has a newer mtime than the one recorded and is hashed next time.
log = logging.getLogger(__name__)
NAME = schema_mod.INPUTSTAT_NAME


def stat_of(path: str) -> tuple[int, int] | None:
    """(size, mtime_ns) of a file, following links as the scan does; None when it cannot
    be stat'ed (the encoder or the hash then says why)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def stat_inputs(root, paths: list, keys: list) -> dict:
    """key -> (size, mtime_ns) of the inputs ``paths`` (relative to ``root``) under
    ``keys`` (their recorded names); unreadable ones left out."""
    out = {}
    for path, key in zip(paths, keys):
        st = stat_of(os.path.join(root, path) if root else path)
        if st is not None:
            out[key] = st
    return out


def stat_all(inputs) -> dict:
    """The record's entries for every input of a conversion (packing.Inputs), taken before
    it is packed."""
    from dlpack_io.packer.scan import shown

    if inputs.members is not None:  # inside containers: the container's size and mtime
        return {p: inputs.members.stat(p) for p in inputs.paths if p in inputs.members.table}
    return stat_inputs(inputs.root, inputs.paths, [shown(p) for p in inputs.paths])


def parse(data: bytes, where: str, manifest: dict) -> dict | None:
    """The record's entries (None: stale), ConversionError when it is damaged."""
    try:
        found = schema_mod.parse_inputstat(data, where, manifest["checksum"])
    except fmt.FormatError as exc:
        raise ConversionError(str(exc)) from None  # it names the file, the value and the fix
    if found is None:
        log.info("%s: written with another manifest (an interrupted write?); every packed "
                 "file is hashed this time", where)
    return found


def read_local(dst: str, manifest: dict) -> dict | None:
    """The record of the data set in folder ``dst`` (None: none there, or stale)."""
    path = os.path.join(dst, NAME)
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        return None
    except fmt.FormatError as exc:
        raise ConversionError(f"{exc}; or pass --checksum") from None
    with open(fd, "rb") as f:
        if st.st_size > schema_mod.MAX_INPUTSTAT_BYTES:  # never read what cannot be valid
            raise ConversionError(f"{path}: {st.st_size} bytes, more than an input-stat "
                                  f"record may have ({schema_mod.MAX_INPUTSTAT_BYTES}); the "
                                  f"quick check cannot trust it: delete it (the next append "
                                  f"hashes every file) or pass --checksum")
        return parse(f.read(schema_mod.MAX_INPUTSTAT_BYTES + 1), path, manifest)


def write_local(dst: str, stats: dict, manifest: dict) -> None:
    """Write the record for ``manifest`` (before the manifest itself: see the module)."""
    atomic_write(os.path.join(dst, NAME), schema_mod.encode_inputstat(stats, manifest["checksum"]))


def read_remote(store, manifest: dict) -> dict | None:
    """The record of the data set at ``store`` (reader.remote.storage.Store)."""
    found = store.head(NAME)
    if found is None:
        return None
    where = store.where(NAME)
    if found["size"] > schema_mod.MAX_INPUTSTAT_BYTES:  # bounded before it is fetched
        raise ConversionError(f"{where}: {found['size']} bytes, more than an input-stat record "
                              f"may have ({schema_mod.MAX_INPUTSTAT_BYTES}); the quick check "
                              f"cannot trust it: delete it or pass --checksum")
    return parse(store.get(NAME, max_bytes=schema_mod.MAX_INPUTSTAT_BYTES), where, manifest)


def write_remote(store, stats: dict, manifest: dict) -> None:
    """Upload the record for ``manifest`` (one PUT: all or nothing), before the manifest."""
    store.put(NAME, schema_mod.encode_inputstat(stats, manifest["checksum"]))


def quick_duplicates(candidates: list, keys: list, recorded: dict | None, now: dict) -> set:
    """The input numbers among ``candidates`` whose stat (``now``, by key) equals the one
    recorded: duplicates without a hash. ``recorded`` None: none (hash them all)."""
    if not recorded:
        return set()
    return {i for i in candidates
            if keys[i] in now and recorded.get(keys[i]) == now[keys[i]]}



# ---- --replace-changed: the old records of changed inputs retired ----------------------------
# ``dlpack convert SRC DST --append --replace-changed``: an input whose path is packed with
# other content is packed again into the append's new shards, and its old record is retired
# in the union manifest (reader/format/schema.py holds the rule readers follow). Old shard
# bytes never change: a reader that opened the old manifest keeps reading what it knew; one
# that opens the new manifest sees the new content at the sample's old index.
#
# A changed input the encoder rejects retires nothing (its old record stays what the data
# set shows). Appending without the flag behaves as before: changed inputs are reported.
class PairingError(ConversionError):
    """The new records cannot be paired with the inputs that replace: the append writes
    no manifest and removes its new shards and journal (the data set stays as it was)."""


def replacements(base: dict, inputs, opts, replacing: dict, todo: list, rejects: list,
                 new_records: int) -> tuple[list, list]:
    """(the ``[old, new]`` record pairs this append adds, the paths they replace) from
    ``replacing`` (input number of SRC -> record it retires), ``todo`` (the input number
    in SRC of each of ``inputs.paths``, packed in ``opts``' packing order), ``rejects``
    (this append's (path, reason) rejects) and ``new_records`` (records the new shards
    hold, checked against the inputs packed)."""
    if not replacing:  # nothing to map (a list may name a path twice, one line rejected)
        return [], []
    refused = {path for path, _ in rejects}
    packed = [(todo[p], shown(inputs.paths[p]))
              for p in packing_order(len(inputs.paths), opts).tolist()
              if shown(inputs.paths[p]) not in refused]
    if len(packed) != new_records:
        raise PairingError(f"the new shards hold {new_records} records for {len(packed)} "
                           f"inputs packed; cannot tell which record replaces which, so no "
                           f"manifest was written and the new shards were removed: a path "
                           f"the list names on several lines was rejected on some of them "
                           f"only; fix or drop those lines, then append again")
    first = base["num_samples"]
    done = [(replacing[i], first + k, path) for k, (i, path) in enumerate(packed)
            if i in replacing]
    return [[old, new] for old, new, _ in done], [path for _, _, path in done]


def with_retired(manifest: dict, base: dict, pairs: list) -> dict:
    """``manifest`` (the union, before its checksum) retiring the data set's records and
    ``pairs``: version RETIRING_VERSION, fields declared; unchanged without any."""
    every = sorted(fmt.retired_pairs(base) + pairs)
    if not every:
        return manifest
    union = dict(manifest, version=fmt.RETIRING_VERSION, fields=manifest.get("fields") or {},
                 **{fmt.RETIRED_KEY: every})
    try:  # what readers check, before a manifest they would refuse is written
        fmt.check_retired(union, "the union manifest")
    except fmt.FormatError as exc:
        raise ConversionError(f"{exc}; no manifest was written (a bug: please report it "
                              f"with the list or folder appended)") from None
    return union
