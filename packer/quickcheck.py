"""rsync's quick check for ``convert --append``: an input whose path is packed already and
whose file has the size and mtime (ns) recorded when it was packed counts as a duplicate
without being read; only new or changed-looking files are hashed. ``--checksum`` (rsync's
``-c``) hashes every file instead.

The trade-off is rsync's, exactly: a file rewritten with other content of the same size
whose mtime was then set back (``os.utime``, ``touch -d``, ``cp -p`` of another file, a
clock jump) is taken as unchanged without --checksum. A file touched with the same content
(new mtime) is hashed, found a duplicate, and its new stat recorded.

The record (reader/format/inputstat.py) is written before the manifest, naming it; the
stat of a file is taken before its bytes are read (hashed or packed), so a file changed
while it is packed has a newer mtime than the one recorded and is hashed next time.
"""
from __future__ import annotations

import logging
import os

from dlpack_io.packer.finalize import atomic_write
from dlpack_io.packer.pipeline import ConversionError
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format import inputstat
from dlpack_io.reader.format.regular import open_regular

log = logging.getLogger(__name__)
NAME = inputstat.INPUTSTAT_NAME


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
    from dlpack_io.packer.names import shown

    if inputs.members is not None:  # inside containers: the container's size and mtime
        return {p: inputs.members.stat(p) for p in inputs.paths if p in inputs.members.table}
    return stat_inputs(inputs.root, inputs.paths, [shown(p) for p in inputs.paths])


def parse(data: bytes, where: str, manifest: dict) -> dict | None:
    """The record's entries (None: stale), ConversionError when it is damaged."""
    try:
        found = inputstat.parse_inputstat(data, where, manifest["checksum"])
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
        if st.st_size > inputstat.MAX_INPUTSTAT_BYTES:  # never read what cannot be valid
            raise ConversionError(f"{path}: {st.st_size} bytes, more than an input-stat "
                                  f"record may have ({inputstat.MAX_INPUTSTAT_BYTES}); the "
                                  f"quick check cannot trust it: delete it (the next append "
                                  f"hashes every file) or pass --checksum")
        return parse(f.read(inputstat.MAX_INPUTSTAT_BYTES + 1), path, manifest)


def write_local(dst: str, stats: dict, manifest: dict) -> None:
    """Write the record for ``manifest`` (before the manifest itself: see the module)."""
    atomic_write(os.path.join(dst, NAME), inputstat.encode_inputstat(stats, manifest["checksum"]))


def read_remote(store, manifest: dict) -> dict | None:
    """The record of the data set at ``store`` (reader.remote.storage.Store)."""
    found = store.head(NAME)
    if found is None:
        return None
    where = store.where(NAME)
    if found["size"] > inputstat.MAX_INPUTSTAT_BYTES:  # bounded before it is fetched
        raise ConversionError(f"{where}: {found['size']} bytes, more than an input-stat record "
                              f"may have ({inputstat.MAX_INPUTSTAT_BYTES}); the quick check "
                              f"cannot trust it: delete it or pass --checksum")
    return parse(store.get(NAME, max_bytes=inputstat.MAX_INPUTSTAT_BYTES), where, manifest)


def write_remote(store, stats: dict, manifest: dict) -> None:
    """Upload the record for ``manifest`` (one PUT: all or nothing), before the manifest."""
    store.put(NAME, inputstat.encode_inputstat(stats, manifest["checksum"]))


def quick_duplicates(candidates: list, keys: list, recorded: dict | None, now: dict) -> set:
    """The input numbers among ``candidates`` whose stat (``now``, by key) equals the one
    recorded: duplicates without a hash. ``recorded`` None: none (hash them all)."""
    if not recorded:
        return set()
    return {i for i in candidates
            if keys[i] in now and recorded.get(keys[i]) == now[keys[i]]}
