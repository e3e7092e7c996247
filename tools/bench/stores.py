"""One folder of JPEGs converted into every contender's format, each by its own writer.

Each writer is ``fn(inputs, out_dir, mode, raw_npy, **options) -> dict`` (extra facts), named
by a convert family of the registry (families.py), and runs in its own process (see
``child``), which times it: the Convert table. Raw (256x256) stores of the peers are written
from the decoded arrays of the ``numpy`` store (its own row times the decoding); ours decode
in our packer, so their raw rows include decoding.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess

import numpy as np

from dlpack_io.tools.bench.work import RAW_SIZE, resize_center

SHARDS = 16  # webdataset splits work by shard: give every worker several


def _read(inputs, i: int) -> bytes:
    with open(os.path.join(inputs.root, inputs.paths[i]), "rb") as f:
        return f.read()


def payloads(inputs, mode: str, raw_npy: str | None):
    """Yield (index, bytes payload, label) in the canonical order."""
    raw = np.load(raw_npy, mmap_mode="r") if mode == "raw" else None
    for i, label in enumerate(inputs.labels):
        data = _read(inputs, i) if raw is None else raw[i].tobytes()
        yield i, data, int(label)


def write_files(inputs, out, mode, raw_npy) -> dict:
    """The JPEG folder itself: an index of absolute paths and labels (nothing converted)."""
    paths = [os.path.join(os.path.abspath(inputs.root), p) for p in inputs.paths]
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"paths": paths, "labels": list(map(int, inputs.labels))}, f)
    return {"warm": [os.path.abspath(inputs.root)]}


def _resize_path(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        return resize_center(f.read())


def write_numpy(inputs, out, mode, raw_npy) -> dict:
    """Decode + resize 256 + centre-crop every image into one raw.npy (N, 256, 256, 3), 2 procs."""
    import multiprocessing as mp

    n = len(inputs.paths)
    arr = np.lib.format.open_memmap(os.path.join(out, "raw.npy"), "w+", np.uint8,
                                    (n, RAW_SIZE, RAW_SIZE, 3))
    paths = [os.path.join(inputs.root, p) for p in inputs.paths]
    with mp.get_context("fork").Pool(os.cpu_count()) as pool:
        for i, img in enumerate(pool.imap(_resize_path, paths, chunksize=16)):
            arr[i] = img
    arr.flush()
    np.save(os.path.join(out, "labels.npy"), np.asarray(inputs.labels, dtype=np.int64))
    return {}


def write_lmdb(inputs, out, mode, raw_npy) -> dict:
    """A plain LMDB: key = 8-digit index, value = 4-byte label + JPEG bytes or raw pixels."""
    import lmdb

    env = lmdb.open(out, map_size=1 << 40, subdir=True, lock=False)
    with env.begin(write=True) as txn:
        for i, data, label in payloads(inputs, mode, raw_npy):
            txn.put(b"%08d" % i, struct.pack("<i", label) + data)
        txn.put(b"__len__", str(len(inputs.labels)).encode())
    env.sync()
    env.close()
    return {}


def write_webdataset(inputs, out, mode, raw_npy) -> dict:
    """WebDataset ShardWriter, SHARDS tar shards, members .jpg/.rgb + .cls."""
    import webdataset as wds

    ext = "jpg" if mode == "jpeg" else "rgb"
    per = -(-len(inputs.labels) // SHARDS)
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=per, verbose=0) as sink:
        for i, data, label in payloads(inputs, mode, raw_npy):
            sink.write({"__key__": f"{i:08d}", ext: data, "cls": label})
    return {}


def write_mds(inputs, out, mode, raw_npy) -> dict:
    """MosaicML Streaming MDSWriter, uncompressed, columns data (bytes) + cls (int)."""
    from dlpack_io.tools.bench.peers import import_streaming

    streaming = import_streaming()
    columns = {"data": "bytes", "cls": "int"}
    with streaming.MDSWriter(out=os.path.join(out, "mds"), columns=columns,
                             size_limit=1 << 26) as sink:
        for _, data, label in payloads(inputs, mode, raw_npy):
            sink.write({"data": data, "cls": label})
    return {}


def _litdata_item(item):
    path_or_index, label, raw_npy = item
    if raw_npy is None:
        with open(path_or_index, "rb") as f:
            return {"data": f.read(), "cls": label}
    return {"data": np.load(raw_npy, mmap_mode="r")[path_or_index].tobytes(), "cls": label}


def write_litdata(inputs, out, mode, raw_npy, *, chunk_bytes: str = "64MB") -> dict:
    """LitData optimize(), 2 workers, 64 MB chunks (or ``chunk_bytes``); restores the
    multiprocessing start method."""
    import multiprocessing as mp

    import litdata

    if mode == "jpeg":
        items = [(os.path.join(os.path.abspath(inputs.root), p), int(lab), None)
                 for p, lab in zip(inputs.paths, inputs.labels)]
    else:
        items = [(i, int(lab), os.path.abspath(raw_npy)) for i, lab in enumerate(inputs.labels)]
    method = mp.get_start_method(allow_none=True)
    try:
        litdata.optimize(fn=_litdata_item, inputs=items, output_dir=os.path.abspath(
            os.path.join(out, "litdata")), chunk_bytes=chunk_bytes, num_workers=os.cpu_count(),
            mode="overwrite")
    finally:
        mp.set_start_method(method, force=True)
    return {}


def write_ffcv(inputs, out, mode, raw_npy) -> dict:
    """FFCV DatasetWriter: RGBImageField (jpg mode re-encodes at q90; raw stores pixels)."""
    from dlpack_io.tools.bench.peers import ffcv_write

    ffcv_write(inputs, os.path.join(out, "data.beton"), mode, raw_npy)
    return {}


def write_npy_files(inputs, out, mode, raw_npy) -> dict:
    """One ``NNNNNN.npy`` file of 256x256x3 pixels per sample, cut from the numpy store."""
    raw = np.load(raw_npy, mmap_mode="r")
    names = []
    for i in range(len(inputs.labels)):
        names.append(os.path.join(os.path.abspath(out), f"{i:06d}.npy"))
        np.save(names[-1], np.asarray(raw[i]))
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump({"paths": names, "labels": list(map(int, inputs.labels))}, f)
    return {}


def write_tar(inputs, out, mode, raw_npy) -> dict:
    """``tar cf`` of the folder into ``out/all.tar``."""
    subprocess.run(["tar", "cf", os.path.join(out, "all.tar"), "-C", str(inputs.root), "."],
                   check=True)
    return {}


def write_ours(inputs, out, mode, raw_npy, *, format="record", workers=None, pack_mode=None,
               **options) -> dict:
    """Our packer (``dlpack_io.packer.convert``), 256 MB shards, all cores unless ``workers``;
    ``pack_mode`` packs in another mode than the work's (planes for the jpeg work);
    ``options`` are convert()'s own (jpeg_restarts, validate)."""
    from dlpack_io.packer import convert

    size = {"size": RAW_SIZE} if mode == "raw" else {}
    convert(inputs.root, out, overwrite=True, progress=False, shard_size="256MB", format=format,
            mode=pack_mode or mode, workers=workers or os.cpu_count(), **size, **options)
    return {}
