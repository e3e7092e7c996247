"""Samples that live inside other files: WebDataset tars, Parquet, TFRecord, RecordIO.

Which files SRC names (a file, a folder, a glob or brace pattern ``train-{0000..0099}.tar``,
local or s3:// / gs:// / az://: fetched into the spool, records.py), which reader reads them
(tarinput.py, framed.py, or the Parquet reader below), and their samples as Inputs. A
sample is named ``CONTAINER/KEY`` (tar) or ``CONTAINER#N`` (record or row N) relative to
SRC; that name and the SHA-256 of its image bytes identify it for ``--append``. Workers
read an image with one ``pread`` (records.Members); the rest is the folder conversion's.

Parquet (pyarrow: ``pip install 'dlpack-io[parquet]'``): a row is a sample. The image
column (``--image-key``; default: the Hugging Face ``datasets`` Image column, else the only
struct column with a binary ``bytes`` child, else the only binary column), the label column
(``--label-key``; default: the ``datasets`` ClassLabel column, its names the class names,
else ``label``); every other column a field: integers -> int, floats -> float, strings ->
str, binary -> bytes, lists of numbers (nested too) -> arrays of that dtype, anything else
-> JSON (so is a string column ``dlpack export`` marked as JSON). Files are read one row
group at a time (the images go into the spool); only labels and fields stay in memory.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import re

import numpy as np

from dlpack_io.packer.progress import Progress
from dlpack_io.packer.records import Members, SourceFile, Spool, download
from dlpack_io.packer.scan import field_name, shown

log = logging.getLogger(__name__)

FORMATS = ("auto", "folder", "webdataset", "parquet", "tfrecord", "recordio")
SUFFIXES = {"webdataset": (".tar", ".tar.gz", ".tgz"), "parquet": (".parquet",), "tfrecord": (
    ".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz"), "recordio": (".rec",)}
SOURCE_OPTIONS = ("source_format", "image_key", "label_key", "spool")
MAX_BRACE_ITEMS = 1_000_000  # a pattern naming more files than this is a typo
JSON_MARK = b'{"type":"json"}'  # Arrow field metadata "dlpack" of a JSON text column


def detect(src, given: str | None) -> str | None:
    """The input format of ``src``: ``given`` unless "auto"/None; else by the suffix of
    SRC or of the files in the folder SRC names. None: an image folder (scan.py)."""
    if given not in (None, "auto"):
        if given not in FORMATS:
            raise ValueError(f"--from {given!r}: expected one of {', '.join(FORMATS)}")
        return None if given == "folder" else given
    text = os.fspath(src)
    from dlpack_io.reader.remote.clouds import is_remote

    names = [text] if is_remote(text) or not os.path.isdir(text) else \
        [e.name for e in os.scandir(text) if e.is_file() and not e.name.startswith(".")]
    kinds = {kind_of(n) for n in names} - {None}
    if not kinds and is_remote(text) and "{" not in text and "*" not in text:  # a prefix
        from dlpack_io.reader.remote.storage import Store

        kinds = {kind_of(n) for n in Store(text).list() if "/" not in n} - {None}
    if len(kinds) > 1:
        raise ValueError(f"{src}: holds {' and '.join(sorted(kinds))} files; pass --from to "
                         f"say which to convert")
    if kinds and os.path.isdir(text) and any(e.is_dir() for e in os.scandir(text)):
        return None  # class folders beside a stray file: an image folder, as before
    if not kinds and (is_remote(text) or os.path.isfile(text) or glob.has_magic(text)):
        raise ValueError(f"{src}: not a folder, and not a file, pattern or URL of a known "
                         f"input format ({', '.join(s for v in SUFFIXES.values() for s in v)}); "
                         f"pass --from FORMAT")
    return kinds.pop() if kinds else None


def kind_of(name: str) -> str | None:
    """The input format a file name's suffix says, or None."""
    low = name.lower().rstrip("/")
    return next((kind for kind, suffixes in SUFFIXES.items() if low.endswith(suffixes)), None)


def expand_braces(pattern: str) -> list:
    """``a{0..2}b{x,y}`` -> a0bx a0by a1bx ... (numeric ranges keep their zero padding)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    body, head, tail = m.group(1), pattern[:m.start()], pattern[m.end():]
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if r:
        lo, hi, width = int(r.group(1)), int(r.group(2)), len(r.group(1))
        if hi < lo or hi - lo >= MAX_BRACE_ITEMS:
            raise ValueError(f"{pattern}: range {{{body}}} must go up, naming at most "
                             f"{MAX_BRACE_ITEMS} files")
        items = [str(k).zfill(width) for k in range(lo, hi + 1)]
    else:
        items = body.split(",")
    out = [head + item + rest for item in items for rest in expand_braces(tail)]
    if len(out) > MAX_BRACE_ITEMS:
        raise ValueError(f"{pattern}: names more than {MAX_BRACE_ITEMS} files")
    return out


def local_files(src: str, kind: str) -> tuple[str, list]:
    """(root, [SourceFile]) of a local SRC: a file, a folder (its files of ``kind``, or
    every file with --from, sorted), or a glob / brace pattern (sorted as written)."""
    if os.path.isfile(src):
        root = os.path.dirname(os.path.abspath(src))
        paths = [os.path.abspath(src)]
    elif os.path.isdir(src):
        root = os.path.abspath(src)
        found = sorted(e.path for e in os.scandir(root) if e.is_file()
                       and not e.name.startswith(".") and not e.name.endswith(".idx"))
        paths = [p for p in found if kind_of(p) == kind] or found
    else:
        patterns = expand_braces(src)
        root = os.path.abspath(os.path.dirname(src.split("{")[0].split("*")[0]) or ".")
        paths = [os.path.abspath(p) for pat in patterns for p in
                 (sorted(glob.glob(pat)) if glob.has_magic(pat) else [pat])]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"{src}: {len(missing)} of the {len(paths)} files it names "
                                    f"do not exist, e.g. {missing[0]}; fix the pattern")
    if not paths:
        raise FileNotFoundError(f"{src}: no {kind} files found")
    return root, [SourceFile(p, os.path.relpath(p, root), (os.stat(p).st_size,
                                                           os.stat(p).st_mtime_ns)) for p in paths]


def remote_files(src: str, kind: str, spool: Spool) -> tuple[str, list]:
    """(root URL, [SourceFile]) of an s3:// / gs:// / az:// SRC, each object fetched into
    the spool through the storage seam (ranged GETs pinned to its ETag: an object replaced
    meanwhile is an error, never a mix of two versions)."""
    from dlpack_io.reader.remote.storage import Store

    base, _, last = src.rstrip("/").rpartition("/")
    if kind_of(last) is None and "{" not in last and "*" not in last:
        store, names = Store(src), None  # a prefix: every object of the format under it
    else:
        store = Store(base)
        names = expand_braces(last)
    listed = store.list() if names is None or any(glob.has_magic(n) for n in names) else {}
    if names is None:
        names = sorted(n for n in listed if kind_of(n) == kind and "/" not in n)
    elif listed:
        import fnmatch

        names = [m for n in names for m in sorted(fnmatch.filter(listed, n))]
    if not names:
        raise FileNotFoundError(f"{src}: no {kind} objects found there")
    return store.url, [download(store, name, spool) for name in names]


def scan_container(src, kind: str, labels: bool, source: dict):
    """The Inputs of a container SRC of format ``kind`` (``source``: --image-key,
    --label-key, --spool); every bad sample is a reject naming file and offset."""
    from dlpack_io.packer.jsonlist import rows_inputs
    from dlpack_io.packer.scan import Inputs
    from dlpack_io.reader.remote.clouds import is_remote

    spool, text = Spool(source.get("spool")), os.fspath(src)
    root, files = remote_files(text, kind, spool) if is_remote(text) else local_files(text, kind)
    members = Members(spool=spool)
    if kind == "webdataset":
        from dlpack_io.packer.tarinput import read_tars as read
    elif kind == "parquet":
        read = read_parquet
    else:
        from dlpack_io.packer.framed import read_framed as read
    rows, classes, schema = read(files, members, spool, kind=kind, image_key=source.get(
        "image_key"), label_key=source.get("label_key"), root=root,
        progress=source.get("progress", True))
    if not rows:
        raise ValueError(f"{src}: no samples found in {len(files)} {kind} file(s)")
    paths, label_list, classes, schema, values = rows_inputs(rows, classes, schema, labels)
    bad = {i: v for i, v in enumerate(values) if isinstance(v, str)}
    return Inputs(root, paths, label_list, classes, fields=schema or {}, bad=bad or None,
                  field_values=values if schema else None,  # none: no field blocks to make
                  sidecars=None if schema else {}, members=members)


def pyarrow_parquet():
    """``pyarrow.parquet``, or ImportError saying how to install it."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("Parquet needs pyarrow: pip install 'dlpack-io[parquet]'") from None
    return pq


def hf_features(schema) -> dict:
    """The ``datasets`` features recorded in a Parquet schema's metadata ({} if none)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        info = json.loads(raw) if raw and len(raw) < 2**24 else {}
        features = info.get("info", {}).get("features", {})
        return features if isinstance(features, dict) else {}
    except (ValueError, AttributeError):
        return {}


def _is_binary(t) -> bool:
    return str(t) in ("binary", "large_binary")


def choose_columns(schema, features: dict, image_key, label_key, where: str) -> tuple:
    """(image column, label column or None) of a Parquet schema."""
    import pyarrow as pa

    names = schema.names
    for given in (image_key, label_key):
        if given is not None and given not in names:
            raise ValueError(f"{where}: no column {given!r}; columns: {', '.join(names)}")
    typed = [n for n in names if isinstance(features.get(n), dict)]
    image = image_key or next((n for n in typed if features[n].get("_type") == "Image"), None)
    structs = [n for n in names if pa.types.is_struct(schema.field(n).type)
               and schema.field(n).type.get_field_index("bytes") >= 0]
    binary = [n for n in names if _is_binary(schema.field(n).type)]
    image = image or (structs[0] if len(structs) == 1 else binary[0] if len(binary) == 1
                      and not structs else None)
    if image is None:
        raise ValueError(f"{where}: cannot tell which column holds the images (columns: "
                         f"{', '.join(names)}); pass --image-key COLUMN")
    label = label_key or next((n for n in typed if features[n].get("_type") == "ClassLabel"),
                              "label" if "label" in names and image != "label" else None)
    return image, label


def _image_bytes(column):
    """The binary array of an image column (a struct's ``bytes`` child, or the column)."""
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if not _is_binary(column.type):
        column = column.field("bytes")
    return column


def _values(column, json_text: bool) -> list:
    """Python values of a field column: lists of numbers as numpy arrays of its dtype."""
    import pyarrow as pa

    t, depth = column.type, 0
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        t, depth = t.value_type, depth + 1
    values = column.to_pylist()
    if json_text:
        return [json.loads(v) if isinstance(v, str) else v for v in values]
    if depth and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        dtype = t.to_pandas_dtype()
        out = []
        for v in values:
            try:
                out.append(None if v is None else np.asarray(v, dtype=dtype))
            except ValueError:  # ragged nesting: JSON
                out.append(v)
        return out
    return values


def _row_group(f, g: int, columns: tuple, out, members, source, rows, first: int) -> None:
    """Spool the images of row group ``g`` and add its rows."""
    image, label, fields, json_cols = columns
    table = f.read_row_group(g, columns=[image] + ([label] if label else []) + fields)
    images = _image_bytes(table.column(image))
    labels = table.column(label).to_pylist() if label else [None] * len(table)
    values = {field_name(c): _values(table.column(c), c in json_cols) for c in fields}
    for k in range(len(table)):
        name = shown(f"{source.name}#{first + k}")
        data = images[k].as_py()
        if data is None:
            rows.append((name, None, f"{source.name}: row {first + k} (row group {g}): no "
                                     f"image bytes in column {image!r} (null, or stored by "
                                     f"path only)"))
            continue
        members.add(name, out.name, out.tell(), len(data), source.stat)
        out.write(data)
        rows.append((name, labels[k], {n: v[k] for n, v in values.items()}))


def read_parquet(files, members, spool, *, image_key=None, label_key=None, progress=True, **_):
    """(rows, classes, schema) of the rows of Parquet ``files``, one row group at a time,
    the image bytes spooled (``members`` says where)."""
    pq = pyarrow_parquet()
    rows, classes = [], None
    total = sum(pq.ParquetFile(s.path).metadata.num_rows for s in files)
    progress = Progress(total, "read parquet", enabled=progress)
    try:
        for source in files:
            f = pq.ParquetFile(source.path)
            schema, features = f.schema_arrow, hf_features(f.schema_arrow)
            image, label = choose_columns(schema, features, image_key, label_key, source.name)
            names = features.get(label, {}).get("names") if label else None
            classes = names if isinstance(names, list) and names else classes
            fields = [n for n in schema.names if n not in (image, label)]
            first = 0
            with open(spool.new_file(source.name + ".images"), "wb") as out:
                for g in range(f.num_row_groups):
                    _row_group(f, g, (image, label, fields, {n for n in fields if (
                        schema.field(n).metadata or {}).get(b"dlpack") == JSON_MARK}), out,
                               members, source, rows, first)
                    done = f.metadata.row_group(g).num_rows
                    first += done
                    progress.update(done, f.metadata.row_group(g).total_byte_size)
    finally:
        progress.close()
    return rows, classes, None
