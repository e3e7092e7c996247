"""``dlpack export SET OUT --to webdataset|parquet``: a packed data set back out, in order.

Every record's stored image bytes go out as they are (JPEG records as ``.jpg``, no
re-encode; raw-pixel records as lossless PNG), with the label and every field:

* WebDataset: tars ``OUT/shard-NNNNNN.tar``, sample ``i`` under key ``%09d``: ``KEY.jpg``
  (or ``.png``), ``KEY.cls`` (the label, as text; none without classes), and each field F
  as ``KEY.F.EXT``: str -> ``txt``, int, float and JSON -> ``json``, array -> ``npy``,
  bytes -> ``bin`` (``KEY.txt`` alone when F is ``txt``, and so on: a folder conversion's
  sidecar names).
* Parquet: ``OUT/shard-NNNNNN.parquet`` in the Hugging Face ``datasets`` layout: ``image``
  (struct of ``bytes`` and ``path``), ``label`` (with the class names as a ClassLabel in
  the schema's ``huggingface`` metadata), one column per field (int64, float64, string,
  binary, nested lists of the array's dtype; JSON as text, marked in the field metadata).

Files are cut by size like our shards (``--shard-size``), written to a temp name and
renamed; ``OUT/_export.json`` (class names, field types, shards) is written last, so that
``dlpack convert OUT`` gives the same samples back, and says the export is complete.
"""
from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import time

import numpy as np

log = logging.getLogger(__name__)
EXT = {"str": "txt", "int": "json", "float": "json", "json": "json", "array": "npy",
       "bytes": "bin"}
ROW_GROUP_BYTES = 32 * 2**20  # a Parquet row group holds about this much image data
INFO_NAME = "_export.json"  # "_": pyarrow and datasets skip it when reading OUT


def suffix_of(name: str, spec: dict) -> str:
    """The WebDataset suffix of field ``name`` (``caption.txt``; ``txt`` for field txt)."""
    ext = EXT[spec["type"]]
    return ext if name == ext and name != "cls" else f"{name}.{ext}"


def member_bytes(value, spec: dict) -> bytes:
    """A field value as the bytes of its tar member."""
    kind = spec["type"]
    if kind == "array":
        out = io.BytesIO()
        np.save(out, np.asarray(value), allow_pickle=False)
        return out.getvalue()
    if kind == "str":
        return value.encode("utf-8", "surrogatepass")
    if kind == "bytes":
        return bytes(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode()


def image_of(payload, entry) -> tuple[bytes, str]:
    """(file bytes, extension) of a record: a JPEG's own bytes, a kept PNG/WebP file's own
    bytes, raw pixels as PNG, decoded planes as the PNG of their (upright) pixels."""
    from dlpack_io.reader import format as fmt

    kind = int(entry["kind"])
    if kind == fmt.KIND_JPEG:
        return bytes(payload), "jpg"
    if kind == fmt.KIND_FILE:
        data = bytes(payload)
        return data, next((name.lower() for magic, name in fmt.FILE_FORMATS.items()
                           if data.startswith(magic)), "bin")
    from PIL import Image

    if kind == fmt.KIND_PLANES:
        from dlpack_io.reader.decode import decode_record

        pixels = decode_record(payload, entry)
    else:
        pixels = np.frombuffer(payload, np.uint8).reshape(int(entry["height"]),
                                                          int(entry["width"]), 3)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue(), "png"


class TarShards:
    """WebDataset tars cut at ``shard_size`` bytes, each written then renamed."""

    ext = "tar"

    def __init__(self, out: str, shard_size: int, ds):
        self.out, self.shard_size, self.ds = out, shard_size, ds
        self.shards, self.file, self.count = [], None, 0

    def _add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o444, 0
        self.file.addfile(info, io.BytesIO(data))

    def add(self, i: int, image: bytes, ext: str, label: int, fields: dict) -> None:
        """Write sample ``i`` (a new tar when this one reached the shard size)."""
        if self.file is not None and self.file.offset >= self.shard_size:
            self.finish()
        if self.file is None:
            self.file = tarfile.open(self.partial(), "w", format=tarfile.GNU_FORMAT)
        key = f"{i:09d}"
        self._add(f"{key}.{ext}", image)
        if self.ds.classes:
            self._add(f"{key}.cls", str(label).encode())
        for name, spec in self.ds.fields.items():
            self._add(f"{key}.{suffix_of(name, spec)}", member_bytes(fields[name], spec))
        self.count += 1

    def partial(self) -> str:
        """The temp path of the shard being written."""
        return os.path.join(self.out, f".shard-{len(self.shards):06d}.{self.ext}.partial")

    def finish(self) -> None:
        """Close the open shard and rename it into place."""
        self.file.close()
        self.file = None
        self.publish()

    def publish(self) -> None:
        """Rename the finished temp file and list it."""
        name = f"shard-{len(self.shards):06d}.{self.ext}"
        os.replace(self.partial(), os.path.join(self.out, name))
        done = sum(s["num_samples"] for s in self.shards)
        self.shards.append({"name": name, "num_samples": self.count - done,
                            "bytes": os.path.getsize(os.path.join(self.out, name))})

    def close(self) -> None:
        """Finish the last shard."""
        if self.file is not None:
            self.finish()


def arrow_type(spec: dict):
    """The Arrow type of a field spec (arrays: a list per dimension)."""
    import pyarrow as pa

    if spec["type"] == "array":
        t = pa.from_numpy_dtype(np.dtype(spec["dtype"]))
        for _ in range(spec["ndim"]):
            t = pa.list_(t)
        return t
    return {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "json": pa.string(),
            "bytes": pa.binary()}[spec["type"]]


def hf_feature(spec: dict) -> dict:
    """The ``datasets`` feature of a field spec."""
    if spec["type"] == "array":
        feature = {"dtype": spec["dtype"], "_type": "Value"}
        for _ in range(spec["ndim"]):
            feature = {"feature": feature, "_type": "Sequence"}
        return feature
    return {"dtype": {"int": "int64", "float": "float64", "bytes": "binary"}.get(
        spec["type"], "string"), "_type": "Value"}


def parquet_schema(ds):
    """The Arrow schema of an export: image, label (with classes), the fields."""
    import pyarrow as pa

    features = {"image": {"_type": "Image"}}
    columns = [pa.field("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())]))]
    if ds.classes:
        columns.append(pa.field("label", pa.int64()))
        features["label"] = {"names": list(ds.classes), "_type": "ClassLabel"}
    for name, spec in ds.fields.items():
        meta = {"dlpack": '{"type":"json"}'} if spec["type"] == "json" else None
        columns.append(pa.field(name, arrow_type(spec), metadata=meta))
        features[name] = hf_feature(spec)
    return pa.schema(columns, metadata={"huggingface": json.dumps({"info": {"features": features}})})


class ParquetShards(TarShards):
    """Parquet files cut at ``shard_size`` bytes, row groups of about ROW_GROUP_BYTES."""

    ext = "parquet"

    def __init__(self, out: str, shard_size: int, ds):
        super().__init__(out, shard_size, ds)
        self.schema, self.rows, self.held, self.written = parquet_schema(ds), [], 0, 0

    def add(self, i: int, image: bytes, ext: str, label: int, fields: dict) -> None:
        """Buffer sample ``i``; write a row group when enough image bytes wait."""
        row = {"image": {"bytes": image, "path": f"{i:09d}.{ext}"}}
        if self.ds.classes:
            row["label"] = label
        for name, spec in self.ds.fields.items():
            value = fields[name]
            row[name] = json.dumps(value, ensure_ascii=False) if spec["type"] == "json" else \
                value.tolist() if isinstance(value, np.ndarray) else value
        self.rows.append(row)
        self.held += len(image)
        self.count += 1
        if self.held >= min(ROW_GROUP_BYTES, self.shard_size):
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as one row group (a new file past the shard size)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.file is None:
            self.file, self.written = pq.ParquetWriter(self.partial(), self.schema), 0
        self.file.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
        self.written += self.held
        self.rows, self.held = [], 0
        if self.written >= self.shard_size:
            self.finish()

    def close(self) -> None:
        """Write what is buffered, finish the last file."""
        if self.rows:
            self.flush()
        super().close()


def export(dataset, out, *, to: str, shard_size="256MB", progress: bool = True) -> dict:
    """Write the data set at ``dataset`` (a folder or s3:// URL) to folder ``out`` as
    WebDataset tars or Parquet files (``to``), in its order; return a summary dict."""
    from dlpack_io.packer.progress import Progress
    from dlpack_io.reader import Dataset
    from dlpack_io.reader.dataset import read_fields
    from dlpack_io.reader.format.spec import parse_size

    shards_class = {"webdataset": TarShards, "parquet": ParquetShards}.get(to)
    if shards_class is None:
        raise ValueError(f"--to {to!r}: expected webdataset or parquet")
    out = os.fspath(out)
    if os.path.exists(out) and os.listdir(out):
        raise ValueError(f"{out}: not empty; export into a new or empty folder")
    ds = Dataset(dataset)
    os.makedirs(out, exist_ok=True)
    writer, start = shards_class(out, parse_size(shard_size), ds), time.perf_counter()
    bar, nbytes = Progress(len(ds), f"export {to}", enabled=progress), 0
    for i in range(len(ds)):
        payload, entry = ds.record(i)
        image, ext = image_of(payload, entry)
        writer.add(i, image, ext, int(entry["label"]), read_fields(ds, i))
        nbytes += len(image)
        bar.update(1, len(image))
    writer.close()
    bar.close()
    seconds = time.perf_counter() - start
    info = {"kind": "dlpack-export", "format": to, "num_samples": len(ds),
            "classes": list(ds.classes), "fields": ds.fields, "shards": writer.shards,
            "suffixes": {n: suffix_of(n, s) for n, s in ds.fields.items()}}
    with open(os.path.join(out, INFO_NAME + ".partial"), "w") as f:
        json.dump(info, f, indent=1)
    os.replace(os.path.join(out, INFO_NAME + ".partial"), os.path.join(out, INFO_NAME))
    log.info("exported %d samples to %s", len(ds), out)
    return {"out": out, "to": to, "num_samples": len(ds), "shards": len(writer.shards),
            "image_bytes": nbytes, "bytes": sum(s["bytes"] for s in writer.shards),
            "seconds": seconds, "mb_per_s": nbytes / 1e6 / max(seconds, 1e-9)}
