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
from collections import Counter

from dlpack_io.packer.scan import hashable
from dlpack_io.packer.writers import create_new, open_nofollow
from dlpack_io.reader import format as fmt

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


# ---- what became of each input ---------------------------------------------------------------
# Proof that a conversion journal accounts for every input it vouches for.
#
# A journal can be damaged (a disk, a copy) or edited. Each line carries a CRC-32 of its own
# canonical JSON (``seal``); a line without one, or whose CRC fails, ends what ``--resume``
# believes. The lines that pass must also add up (``accounted``): shard k covers the inputs
# from where shard k-1 ended to its ``end_input``, and each of them was either packed into it
# or rejected, so ``end_input - previous end_input == num_samples + len(rejects)``; its first
# sample follows the previous shard's last; its class counts sum to its samples. The first
# line that does not add up ends what is kept: that shard and every later one are redone.
CRC_KEY = "crc32"  # a shard entry has its own "crc" (the shard's); this one is the line's


def line_crc(entry: dict) -> int:
    """CRC-32 of ``entry``'s canonical JSON, its own line checksum left out."""
    body = {k: v for k, v in entry.items() if k != CRC_KEY}
    return fmt.crc32(json.dumps(body, sort_keys=True).encode())


def seal(entry: dict) -> dict:
    """``entry`` with its line checksum (what the journal writes)."""
    return {**{k: v for k, v in entry.items() if k != CRC_KEY}, CRC_KEY: line_crc(entry)}


def unseal(entry: dict) -> dict:
    """``entry`` without its line checksum (what the journal's reader hands on)."""
    return {k: v for k, v in entry.items() if k != CRC_KEY}


def sealed(entry) -> bool:
    """True when ``entry`` is a dict whose line checksum is present and right."""
    return isinstance(entry, dict) and entry.get(CRC_KEY) == line_crc(entry)


def _count(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} is {value!r}, expected a count")
    return value


def line_problem(entry: dict, start: int, next_sample: int, num_inputs: int,
                 num_classes: int) -> str | None:
    """Why shard line ``entry`` (covering inputs from ``start``) does not add up, or None."""
    try:
        shard = entry["shard"]
        samples = _count(shard["num_samples"], "num_samples")
        end = _count(entry["end_input"], "end_input")
        rejects = entry["rejects"]
        if not isinstance(rejects, list) or any(
                not isinstance(r, list) or len(r) != 2 or not all(isinstance(x, str) for x in r)
                for r in rejects):
            return "rejects is not a list of (path, reason) pairs"
        if shard["first_sample"] != next_sample:
            return f"first_sample {shard['first_sample']!r}, expected {next_sample}"
        if not start < end <= num_inputs:
            return f"end_input {end} outside ({start}, {num_inputs}]"
        if end - start != samples + len(rejects):
            return (f"inputs {start}-{end - 1} ({end - start}) != {samples} samples + "
                    f"{len(rejects)} rejects")
        counts = [_count(c, "a class count") for c in entry["class_counts"]]
        if len(counts) != num_classes or (num_classes and sum(counts) != samples):
            return f"class_counts {counts[:8]} do not sum to its {samples} samples"
    except (KeyError, TypeError, ValueError) as exc:
        return f"malformed ({type(exc).__name__}: {exc})"
    return None


def accounted(entries: list, plan: dict, num_classes: int, where: str) -> list:
    """The leading ``entries`` (shard lines of a journal) that add up; a warning names the
    first that does not (it and all after it are redone)."""
    num_inputs = plan.get("num_inputs")
    if not isinstance(num_inputs, int):
        return []
    # an append's shards follow the data set's samples (the plan line says where)
    kept, start, next_sample = [], 0, plan.get("first_sample", 0)
    for i, entry in enumerate(entries):
        problem = line_problem(entry, start, next_sample, num_inputs, num_classes)
        if problem:
            log.warning("%s: journal line %d does not add up (%s); redoing from there", where,
                        i + 2, problem)
            break
        kept.append(entry)
        start, next_sample = entry["end_input"], next_sample + entry["shard"]["num_samples"]
    return kept


def paths_problem(entry: dict, slice_paths: list, meta_paths: list | None) -> str | None:
    """Why a journal line disagrees with the shard it vouches for, or None: the inputs it
    covers (``slice_paths``, in packing order) must be exactly the shard's own paths (its
    metadata, in order) plus the line's rejects."""
    if meta_paths is None:
        return "its shard's metadata (source paths) cannot be read"
    rejected = [r[0] for r in entry["rejects"]]
    if Counter(slice_paths) != Counter(meta_paths) + Counter(rejected):
        lost = sorted((Counter(slice_paths) - Counter(meta_paths) - Counter(rejected)))
        return (f"its inputs are not its shard's {len(meta_paths)} samples + "
                f"{len(rejected)} rejects (unaccounted: {lost[:3]})")
    packed = set(meta_paths)
    if [p for p in slice_paths if p in packed] != meta_paths:
        return "its shard holds its inputs in another order"
    return None
