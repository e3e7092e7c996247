"""Converting from and exporting to other formats: MB/s of image bytes, median of repeats.

    python -m benchmarks.formats [--count 600] [--repeats 3] [--workers 0] [--work DIR]

The same photo-like JPEGs (ImageNet-sized, ~110 KB) are written as a class folder, as
WebDataset tars (webdataset's own ShardWriter), as Parquet in the Hugging Face layout
(pyarrow; ``datasets`` is not needed), as TFRecord and as RecordIO (small writers here,
byte for byte the published formats); then ``dlpack convert`` of each is timed wall-clock,
scan included (as it runs by default, and with neither validation nor restart markers: no
JPEG decoded), and so are the writers themselves and ``dlpack export`` to both formats.
Prints one JSON line per figure and the load average beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import tempfile
import time
from pathlib import Path


def _masked(data: bytes) -> int:
    import crc32c

    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _ld(num: int, data: bytes) -> bytes:
    def varint(v):
        out = bytearray()
        while True:
            out.append((v & 0x7F) | (0x80 if v >> 7 else 0))
            v >>= 7
            if not v:
                return bytes(out)
    return varint(num << 3 | 2) + varint(len(data)) + data


def _example(image: bytes, label: int) -> bytes:
    feats = {"image/encoded": _ld(1, _ld(1, image)),
             "image/class/label": _ld(3, _ld(1, bytes([label])))}
    return _ld(1, b"".join(_ld(1, _ld(1, k.encode()) + _ld(2, v)) for k, v in feats.items()))


def write_tfrecord(items, path: Path) -> None:
    """TFRecord of tf.train.Examples (image/encoded, image/class/label)."""
    with open(path, "wb") as f:
        for image, label in items:
            rec = _example(image, label)
            head = struct.pack("<Q", len(rec))
            f.write(head + struct.pack("<I", _masked(head)) + rec + struct.pack("<I", _masked(rec)))


def write_recordio(items, path: Path) -> None:
    """im2rec-style RecordIO (IRHeader flag 0, float label) with its .idx."""
    with open(path, "wb") as f, open(path.with_suffix(".idx"), "w") as idx:
        for k, (image, label) in enumerate(items):
            data = struct.pack("<IfQQ", 0, float(label), k, 0) + image
            idx.write(f"{k}\t{f.tell()}\n")
            f.write(struct.pack("<II", 0xCED7230A, len(data)) + data + b"\0" * (-len(data) % 4))


def write_wds(items, folder: Path) -> None:
    """Tars of KEY.jpg + KEY.cls by WebDataset's ShardWriter (100 MB shards)."""
    import webdataset as wds

    folder.mkdir()
    with wds.ShardWriter(str(folder / "train-%04d.tar"), maxsize=100e6, verbose=0) as sink:
        for k, (image, label) in enumerate(items):
            sink.write({"__key__": f"{k:08d}", "jpg": image, "cls": label})


def write_parquet(items, folder: Path) -> None:
    """One Parquet file in the datasets layout (image struct, ClassLabel), 100-row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    meta = {"info": {"features": {"image": {"_type": "Image"}, "label": {
        "_type": "ClassLabel", "names": [str(c) for c in range(10)]}}}}
    table = pa.table({"image": [{"bytes": im, "path": f"{k}.jpg"} for k, (im, _) in
                                enumerate(items)], "label": [lab for _, lab in items]})
    pq.write_table(table.replace_schema_metadata({"huggingface": json.dumps(meta)}),
                   folder / "train-00000.parquet", row_group_size=100)


def _timed(fn, repeats: int, cleanup) -> float:
    times = []
    for _ in range(repeats):
        cleanup()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _convert_and_export(work: Path, args, report, clear) -> None:
    """Time dlpack convert of every format (by default, and without decoding any JPEG),
    then dlpack export to both formats."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.export import export

    out = work / "out"
    opts = dict(workers=args.workers, progress=False)
    quick = dict(opts, validate=False, jpeg_restarts=False)  # bytes only: no JPEG decoded
    for label, how in (("", opts), (" --no-validate --no-restart-markers", quick)):
        for what, src in (("folder of files", work / "folder"), ("webdataset tars", work / "wds"),
                          ("parquet", work / "parquet"), ("tfrecord", work / "train.tfrecord"),
                          ("recordio", work / "train.rec")):
            report(f"dlpack convert from {what}{label}", _timed(
                lambda: convert(src, out, **how), args.repeats, clear(out)))
    clear(out)()
    convert(work / "folder", out, **opts)
    for to in ("webdataset", "parquet"):
        report(f"dlpack export --to {to}", _timed(
            lambda: export(out, work / "exported", to=to, progress=False), args.repeats,
            clear(work / "exported")))


def main(argv=None) -> None:
    """Write the formats, time the conversions and exports, print one JSON line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp one)")
    args = parser.parse_args(argv)
    from dlpack_io.tools.synth import make_image_folder

    work = Path(args.work or tempfile.mkdtemp(prefix="dlpack-formats-"))
    paths = sorted(make_image_folder(work / "folder", args.count, 10, seed=0))
    items = [(p.read_bytes(), int(p.parent.name.split("_")[1])) for p in paths]
    mb = sum(len(im) for im, _ in items) / 1e6

    def report(what: str, seconds: float) -> None:
        print(json.dumps({"what": what, "images": len(items), "MB": round(mb, 1),
                          "seconds": round(seconds, 3), "MB_per_s": round(mb / seconds, 1),
                          "load": os.getloadavg()[0]}), flush=True)

    def clear(*folders):
        return lambda: [shutil.rmtree(f, ignore_errors=True) for f in folders]

    writers = {"webdataset ShardWriter": (write_wds, work / "wds"),
               "pyarrow to_parquet (datasets layout)": (write_parquet, work / "parquet"),
               "TFRecord writer": (write_tfrecord, work / "train.tfrecord"),
               "RecordIO writer (im2rec layout)": (write_recordio, work / "train.rec")}
    for what, (write, where) in writers.items():
        seconds = _timed(lambda: write(items, where), args.repeats,
                         lambda: (shutil.rmtree(where) if where.is_dir() else
                                  where.unlink() if where.exists() else None))
        report(f"write: {what}", seconds)
    _convert_and_export(work, args, report, clear)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
