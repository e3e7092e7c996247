"""The resume journal of a conversion in progress, and the lock that guards DST.

``DST/.dlpack-convert.journal`` holds JSON lines: first the plan (a hash of the inputs and
the output options), then one line per finished shard, appended and fsynced after the
shard's rename. ``--resume`` keeps the shards the journal vouches for and redoes the rest;
since encoding is deterministic and shards are cut by size in input order, the result is
byte-identical to an uninterrupted run. The journal and the lock go when the manifest lands.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os

from dlpack_io.packer.accounting import seal, sealed, unseal
from dlpack_io.packer.names import hashable
from dlpack_io.packer.nofollow import create_new, open_nofollow

log = logging.getLogger(__name__)

JOURNAL_NAME = ".dlpack-convert.journal"
JOURNAL_TMP_NAME = JOURNAL_NAME + ".tmp"  # a fresh journal is written here, then renamed
LOCK_NAME = ".dlpack-convert.lock"


def plan_hash(inputs, stats, output_options: dict, format_version: int) -> str:
    """Digest of everything that decides the output bytes: options, inputs, their labels,
    sizes and modification times."""
    h = hashlib.sha256()
    h.update(json.dumps([format_version, output_options, inputs.classes], sort_keys=True).encode())
    for path, label, (size, mtime) in zip(inputs.paths, inputs.labels, stats):
        h.update(hashable(f"{path}\0{label}\0{size}\0{mtime}\n"))  # any name's real bytes
    return h.hexdigest()


def inputs_hash(inputs, stats) -> str:
    """Digest of the inputs alone (paths, labels, classes, sizes, modification times)."""
    return plan_hash(inputs, stats, {}, 0)


def plan_line(inputs, stats, output_options: dict, format_version: int) -> dict:
    """The journal's first line: the plan hash, and next to it what went into it (the
    options, the format version, a digest of the inputs), so that a refused ``--resume``
    can say what changed."""
    return {"plan": plan_hash(inputs, stats, output_options, format_version),
            "num_inputs": len(inputs.paths), "options": dict(output_options),
            "format_version": format_version, "inputs": inputs_hash(inputs, stats)}


def plan_differences(old: dict, new: dict) -> list[str]:
    """What differs between an interrupted run's plan line and this run's, in words."""
    if old.get("plan") == new.get("plan"):
        return []
    if "options" not in old:  # a journal written before the options were recorded
        return ["the source files or packing options (the interrupted run's journal does "
                "not record which)"]
    out = []
    if old.get("format_version") != new.get("format_version"):
        out.append(f"format version {old.get('format_version')} then, "
                   f"{new.get('format_version')} now")
    before, now = old["options"], new["options"]
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            out.append(f"{key}: {before.get(key)!r} then, {now.get(key)!r} now")
    if old.get("inputs") != new.get("inputs"):
        count = (f"{old.get('num_inputs')} inputs then, {new.get('num_inputs')} now"
                 if old.get("num_inputs") != new.get("num_inputs") else
                 f"{new.get('num_inputs')} inputs, but a file was renamed, relabelled or "
                 f"modified")
        out.append(f"the source files ({count})")
    return out or ["the plan (same options and inputs, another digest)"]


def refusal(where: str, old: dict, new: dict) -> str | None:
    """The message refusing to resume ``where`` when the plans differ, else None."""
    differences = plan_differences(old, new)
    if not differences:
        return None
    return (f"{where}: cannot resume: {'; '.join(differences)} (the interrupted conversion "
            f"used other settings or inputs); run it with the same options and source files, "
            f"or use --overwrite to start again")


class DstLock:
    """An exclusive, non-blocking flock on DST: two converts cannot write one DST."""

    def __init__(self, dst):
        self.path = os.path.join(dst, LOCK_NAME)
        self._fd = None

    def acquire(self) -> None:
        """Take the lock or raise RuntimeError naming the holder."""
        try:
            fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EINVAL):  # a link or a FIFO planted in DST
                raise RuntimeError(exc.strerror) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise RuntimeError(f"{os.path.dirname(self.path)} is being written by another "
                                   f"dlpack convert (pid {holder}); wait for it or choose "
                                   f"another DST") from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self, remove: bool = False) -> None:
        """Drop the lock; ``remove`` deletes the lock file first (conversion complete)."""
        if self._fd is None:
            return
        if remove:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        os.close(self._fd)
        self._fd = None


def read_journal(dst) -> tuple[dict | None, list]:
    """Return (plan line, shard lines) of DST's journal; (None, []) if there is none.

    A torn last line (a crash mid-append) is ignored: that shard is simply redone.
    """
    path = os.path.join(dst, JOURNAL_NAME)
    try:
        fd = open_nofollow(path, os.O_RDONLY)
    except FileNotFoundError:
        return None, []
    except OSError:  # a symlink or FIFO where our journal should be: not a journal of ours
        return None, []
    with open(fd, encoding="utf-8", errors="replace") as f:
        return parse_journal(f.read())


def journal_line(entry: dict) -> str:
    """One journal line: ``entry`` with its line checksum (accounting.seal), newline ended."""
    return json.dumps(seal(entry), sort_keys=True) + "\n"


def parse_journal(text: str):
    """(plan line, shard entries) of a journal's text; (None, []) when it is not one of
    ours. A line cut short by a crash ends it: what follows was never committed; so does a
    line whose checksum fails (damaged or edited: a warning says which)."""
    entries = []
    for number, line in enumerate(text.split("\n"), 1):
        try:
            entry = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            break
        if not sealed(entry):
            if line.strip():
                log.warning("journal line %d fails its checksum (damaged or edited); it and "
                            "the lines after it are not trusted: redoing from there", number)
            break
        entries.append(unseal(entry))
    if not entries or "plan" not in entries[0]:
        return None, []
    return entries[0], entries[1:]


class Journal:
    """Append-only writer of the journal."""

    def __init__(self, dst, plan: dict | None = None, shards: list | None = None):
        self.path = os.path.join(dst, JOURNAL_NAME)
        self.shards = list(shards or [])
        if plan is not None:  # fresh start: rewrite the file with the plan and kept shards
            tmp = os.path.join(dst, JOURNAL_TMP_NAME)
            with open(create_new(tmp), "w", encoding="utf-8") as f:
                for entry in [plan] + self.shards:
                    f.write(journal_line(entry))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)

    def append(self, entry: dict) -> None:
        """Durably record one finished shard."""
        with open(open_nofollow(self.path, os.O_WRONLY | os.O_APPEND), "w", encoding="utf-8") as f:
            f.write(journal_line(entry))
            f.flush()
            os.fsync(f.fileno())
        self.shards.append(entry)

    def remove(self) -> None:
        """Delete the journal (the manifest now vouches for the data set)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
