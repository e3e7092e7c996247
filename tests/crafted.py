"""Crafted data sets, built as an attacker would: with reader/format.py itself, every
checksum resealed, and the hostile consumers run in a child process.

``reseal_shard`` rewrites one record shard from (records, index entries, metadata) and
updates the manifest (shard CRC, size, counts, checksum), so damage reaches the checks
behind the checksums. ``run_consumers`` opens a data set the ways a user would (Dataset,
Loader with every worker kind, inspect, verify) in a child process under an address-space
limit and a deadline, and returns one outcome line per consumer.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np

from dlpack_io.reader import format as fmt

ADDRESS_SPACE = 3 * 2**30   # RLIMIT_AS of the child: torch needs ~0.7 GiB of it
DEADLINE = 90               # seconds; a healthy child needs a few


def read_shard(path) -> tuple[fmt.ShardHeader, bytes, np.ndarray, bytes]:
    """(header, data section bytes, index copy, metadata bytes) of a record shard."""
    data = open(path, "rb").read()
    h = fmt.unpack_header(data[:fmt.HEADER_SIZE], len(data), str(path))
    index = np.frombuffer(data[h.index_offset:h.meta_offset], fmt.INDEX_DTYPE).copy()
    return h, data[h.data_offset:h.index_offset], index, data[h.meta_offset:]


def load_manifest(ds) -> dict:
    return json.loads((ds / fmt.MANIFEST_NAME).read_text())


def write_manifest(ds, manifest: dict) -> None:
    """Write ``manifest`` with its checksum resealed."""
    manifest["checksum"] = fmt.manifest_checksum(manifest)
    (ds / fmt.MANIFEST_NAME).write_bytes(fmt.encode_meta(manifest))


def reseal_shard(ds, k: int, data: bytes, index: np.ndarray, meta: bytes | None = None,
                 counts: bool = True) -> None:
    """Write shard ``k`` of record data set ``ds`` with this data section, index and
    metadata, every checksum recomputed, and the manifest updated to vouch for it."""
    manifest = load_manifest(ds)
    entry = manifest["shards"][k]
    path = ds / entry["name"]
    if meta is None:
        meta = read_shard(path)[3]
    index_bytes = index.tobytes()
    page, header = fmt.pack_header(len(index), len(data), len(meta), fmt.crc32(index_bytes),
                                   fmt.crc32(meta))
    blob = page + data + index_bytes + meta
    path.write_bytes(blob)
    entry.update(crc=header.header_crc, bytes=len(blob))
    if counts:
        entry["num_samples"] = len(index)
        first = 0
        for e in manifest["shards"]:
            e["first_sample"], first = first, first + e["num_samples"]
        manifest["num_samples"] = first
        labels = np.concatenate([read_shard(ds / e["name"])[2]["label"]
                                 for e in manifest["shards"]])
        manifest["class_counts"] = np.bincount(labels[labels >= 0].clip(0, len(
            manifest["classes"]) - 1), minlength=len(manifest["classes"])).tolist()
    manifest["num_bytes"] = sum(e["bytes"] for e in manifest["shards"])
    write_manifest(ds, manifest)


def layout(lengths) -> tuple[np.ndarray, int]:
    """Offsets and data-section size for records of these lengths, back to back."""
    starts, end = fmt.record_offsets(np.asarray(lengths, dtype=np.uint32))
    return starts, end - fmt.HEADER_SIZE


def one_record_shard(ds, payload: bytes, *, height: int, width: int, kind: int,
                     channels: int = 3, label: int = 0) -> None:
    """Replace shard 0 of ``ds`` by a single record with this payload and index entry."""
    index = np.zeros(1, fmt.INDEX_DTYPE)
    index[0] = (fmt.HEADER_SIZE, len(payload), label, fmt.crc32(payload), height, width,
                channels, kind, 1, 0)  # orientation 1 (upright), colour 0
    pad = fmt.align_up(len(payload)) - len(payload)
    reseal_shard(ds, 0, payload + b"\0" * pad, index)


CHILD = textwrap.dedent('''
    import json, os, resource, sys, traceback
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    cases, modes = json.loads(sys.argv[1]), sys.argv[2].split(",")
    from dlpack_io.reader import Dataset, Loader, RandomResizedCrop, SampleError, WorkerError
    from dlpack_io.reader.format import FormatError
    from dlpack_io.tools import inspection
    from dlpack_io.tools.verification import verify
    CLEAN = (FormatError, SampleError, WorkerError, FileNotFoundError)

    def dataset(path):
        ds = Dataset(path)
        for i in range(len(ds)):
            ds[i]

    def loader(**kw):
        def run(path):
            ds = Dataset(path)
            for _ in Loader(ds, batch_size=4, transforms=[RandomResizedCrop(8)], **kw):
                pass
        return run

    def inspect(path):
        inspection.summary(path)
        inspection.shard_detail(path, 0)
        inspection.record_detail(path, 0)
        inspection.contact_sheet(path, os.path.join(os.environ["OUT"], "sheet.png"), count=4)

    def verify_(path):
        report = verify(path, decode=True, progress=False)
        if not report.ok:
            return "DAMAGED " + " | ".join(p["where"] + ": " + p["problem"] for p in report.problems)

    RUN = {{"dataset": dataset, "serial": loader(num_workers=0),
           "threads": loader(num_workers=2, worker_kind="thread"),
           "processes": loader(num_workers=2, worker_kind="process"),
           "inspect": inspect, "verify": verify_}}
    for case, path in cases:
        for mode in modes:
            print("START", case, mode, flush=True)
            try:
                out = RUN[mode](path)
                line = "OK" if out is None else out
            except CLEAN as exc:
                line = "CLEAN " + type(exc).__name__ + " " + str(exc)
            except BaseException as exc:
                line = "UNEXPECTED " + type(exc).__name__ + " " + str(exc)[:300]
                traceback.print_exc()
            print("RESULT", case, mode, line.replace("\\n", " "), flush=True)
''')

MODES = ("dataset", "serial", "threads", "processes", "inspect", "verify")


def _child(cases: list, modes, tmp_path) -> tuple[str, str, object]:
    env = dict(os.environ, OUT=str(tmp_path))
    try:
        done = subprocess.run([sys.executable, "-c", CHILD.format(limit=ADDRESS_SPACE),
                               json.dumps(cases), ",".join(modes)], capture_output=True,
                              text=True, timeout=DEADLINE + 10 * len(cases), env=env)
        return done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        out, err = (o.decode() if isinstance(o, bytes) else (o or "") for o in (exc.stdout, exc.stderr))
        return out, err, "timeout"


def run_consumers(cases: dict, tmp_path, modes=MODES) -> dict:
    """{case: {mode: outcome line, "_stderr": ...}}: every case opened every way a user
    would, in child processes that share one torch import. A child that dies (signal,
    hang, limit) is replaced by a fresh one for the cases after it; the case that was
    running gets "DIED <exit status>" for its mode and no line for the modes after it."""
    results = {case: {} for case in cases}
    todo = [[case, str(path)] for case, path in cases.items()]
    while todo:
        out, err, rc = _child(todo, modes, tmp_path)
        current = None
        for line in out.splitlines():
            kind, _, rest = line.partition(" ")
            if kind in ("START", "RESULT"):
                case, mode, outcome = (rest.split(" ", 2) + [""])[:3]
                current = (case, mode)
                if kind == "RESULT":
                    results[case][mode] = outcome
        if current is not None and current[1] not in results[current[0]]:
            results[current[0]][current[1]] = f"DIED {rc}"
            results[current[0]]["_stderr"] = err[-3000:]
        if rc == 0 or current is None:
            break
        done = [c for c, _ in todo].index(current[0])
        todo = todo[done + 1:]
    return results


def assert_refused(results: dict, match: str, modes=MODES) -> None:
    """Every mode ended in a clean error (or DAMAGED for verify) whose text has ``match``:
    no signal, hang, MemoryError or raw exception."""
    for mode in modes:
        line = results.get(mode)
        assert line is not None, f"{mode}: no result (an earlier mode killed the child): {results}"
        expected = "DAMAGED" if mode == "verify" else "CLEAN"
        assert line.startswith(expected), f"{mode}: {line}\n{results.get('_stderr', '')}"
        assert match in line, f"{mode}: {line!r} does not name {match!r}"
        assert "MemoryError" not in line
