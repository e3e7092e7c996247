"""Fields of a conversion's inputs: read from sidecar files and list rows (``FieldSource``),
made into field blocks ahead of the writer in threads, and the shape every record of an
array field shares (so the manifest states it and the Loader stacks it).
"""
from __future__ import annotations

import io
import json
import math
import os
import struct
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dlpack_io.packer.records import RejectedInput
from dlpack_io.reader.format.checks import InputTooLarge, read_input
from dlpack_io.reader.format.fields import encode_fields, field_spans, spec_of
from dlpack_io.reader.format.schema import MAX_JSON_DEPTH, json_depth

# ---- fields read from sidecars and list rows -------------------------------------------------
# Fields for ``dlpack convert``: sidecar files next to each image (WebDataset's
# convention) or the extra keys / columns of a list, made into each record's field block.
#
# Sidecars: for ``SRC/.../name.jpg`` the files ``name.txt`` (field "txt", UTF-8 text),
# ``name.json`` ("json", any JSON value), ``name.cls`` ("cls", whitespace-separated integers:
# an int64 array, one or many labels) and ``name.npy`` ("npy", a numpy array, dtype and
# ndim of the first one found). A field exists when at least one image has that sidecar;
# an image lacking one, or whose sidecar is not what its type needs, is rejected with the
# file and the reason (``--on-error`` applies), and nothing is written for it.
SIDECARS = ("txt", "json", "cls", "npy")
MAX_SIDECAR_BYTES = 256 * 2**20  # one sidecar is read whole
MASK_SUFFIX = ".mask.png"  # x.mask.png beside x.jpg: x's segmentation mask (targets.py)


def parse_fields_option(text, known) -> tuple | None:
    """``--fields``: None (every field found), () for "none", else the names given, each
    one of ``known``."""
    if text is None or text.strip().lower() == "all":
        return None
    if text.strip().lower() == "none":
        return ()
    names = tuple(n.strip().lstrip(".") for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--fields {text!r}: {unknown[0]!r} is not one of the fields there "
                         f"are ({','.join(known) or 'none'}); give a comma-separated subset, "
                         f"or none")
    return names


def with_fields(inputs, fields_option):
    """``inputs`` with the field schema to pack (None: no fields): a list's extra keys or
    columns when it has any, else the sidecars found next to the images."""
    import dataclasses

    if inputs.field_values is not None:
        wanted = parse_fields_option(fields_option, tuple(inputs.fields))
        schema = {k: v for k, v in inputs.fields.items() if wanted is None or k in wanted}
        values = [v if isinstance(v, str) else {k: v[k] for k in schema}
                  for v in inputs.field_values]  # bad lines stay rejects
        return dataclasses.replace(inputs, fields=schema or None, field_values=values)
    wanted = parse_fields_option(fields_option, SIDECARS)
    seen = inputs.sidecars  # counted by the scan; None: look beside each image
    kinds = () if wanted == () else found_sidecars(inputs.root, inputs.paths, wanted) \
        if seen is None else tuple(k for k in SIDECARS if seen.get(k) and k in (wanted or SIDECARS))
    schema = sidecar_schema(inputs.root, inputs.paths, kinds)
    ignored = dict(inputs.ignored or {})  # sidecars not packed are ignored files after all
    for kind, n in (seen or {}).items():
        if kind not in kinds:
            ignored[f".{kind}"] = ignored.get(f".{kind}", 0) + n
    return dataclasses.replace(inputs, fields=schema or None, ignored=dict(sorted(ignored.items())),
                               sidecars={k: seen[k] for k in kinds} if seen else None)


def field_source(inputs):
    """The FieldSource of a conversion, or None when its inputs have no fields at all."""
    targets = getattr(inputs, "targets", None)  # boxes, masks: packer/targets.py
    if not inputs.fields and inputs.field_values is None and targets is None:
        return None
    return FieldSource(inputs.fields or {}, inputs.root, inputs.paths, inputs.field_values,
                       targets)


def _stem(root: str, rel: str) -> str:
    return os.path.splitext(os.path.join(root, rel))[0]


def found_sidecars(root: str, paths: list, wanted) -> tuple:
    """The sidecar kinds (of ``wanted``: None = all) that at least one image has."""
    kinds = [k for k in SIDECARS if wanted is None or k in wanted]
    found = set()
    for rel in paths:
        stem = _stem(root, rel)
        found.update(k for k in kinds if k not in found and os.path.isfile(f"{stem}.{k}"))
        if len(found) == len(kinds):
            break
    return tuple(k for k in SIDECARS if k in found)


def _read(path: str) -> bytes:
    try:  # never blocks on a FIFO, never reads a device without end
        return read_input(path, MAX_SIDECAR_BYTES)
    except InputTooLarge:
        raise RejectedInput(f"sidecar {path} is over {MAX_SIDECAR_BYTES} bytes") from None
    except FileNotFoundError:
        raise RejectedInput(f"missing sidecar {os.path.basename(path)} (other images have "
                            f"one; --fields chooses which sidecars to pack)") from None
    except OSError as exc:
        raise RejectedInput(f"cannot read sidecar {path}: {exc.strerror or exc}") from None


def sidecar_value(path: str, kind: str):
    """The value of one sidecar file; RejectedInput naming the file and the reason."""
    return decode_sidecar(_read(path), kind, path)


def decode_sidecar(data: bytes, kind: str, path: str):
    """The value of sidecar bytes of ``kind`` (also a tar member's: tarinput.py);
    RejectedInput naming ``path`` and the reason."""
    try:
        if kind == "npy":
            return _npy(data, path)
        text = data.decode("utf-8")
        if kind == "json":
            depth = json_depth(data)  # measured before parsing: the parser recurses
            if depth > MAX_JSON_DEPTH:
                raise RejectedInput(f"sidecar {path}: JSON nested {depth} levels, a reader "
                                    f"takes at most {MAX_JSON_DEPTH}")
            return json.loads(text)
        if kind == "cls":
            return np.array([int(t) for t in text.split()], dtype=np.int64)
        return text
    except UnicodeDecodeError as exc:
        raise RejectedInput(f"sidecar {path} is not valid UTF-8 ({exc})") from None
    except OverflowError:
        raise RejectedInput(f"sidecar {path}: an integer beyond int64") from None
    except ValueError as exc:  # bad JSON, a non-integer in .cls, a bad or pickled .npy
        what = {"json": "valid JSON", "cls": "whitespace-separated integers",
                "npy": "a numpy .npy array (no pickles)"}[kind]
        raise RejectedInput(f"sidecar {path} is not {what} ({str(exc)[:120]})") from None


def _npy(data: bytes, path: str) -> np.ndarray:
    """The array of a .npy file's bytes; its header's shape and dtype are checked against
    the bytes there are before numpy sizes anything from them (a header may claim 2^40
    elements of a 100-byte file)."""
    from numpy.lib import format as npy

    f = io.BytesIO(data)
    version = npy.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f".npy format version {version[0]}.{version[1]}; expected 1.0 or 2.0")
    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, _, dtype = read(f)
    if dtype.hasobject:
        raise ValueError("object arrays (pickles) are not read")
    need = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
    if need != len(data) - f.tell():
        raise RejectedInput(f"sidecar {path}: its header claims shape {shape} of {dtype} "
                            f"({need} bytes), the file holds {len(data) - f.tell()}")
    return np.load(io.BytesIO(data), allow_pickle=False)


def sidecar_schema(root: str, paths: list, kinds: tuple) -> dict:
    """The schema of sidecar ``kinds``; .npy takes dtype and ndim from the first readable
    one (a bad one is its image's reject when packed, not the end of the run)."""
    schema = {"txt": {"type": "str"}, "json": {"type": "json"},
              "cls": {"type": "array", "dtype": "int64", "ndim": 1, "shape": None}}
    out = {k: schema[k] for k in kinds if k != "npy"}
    first_error = None
    for rel in paths if "npy" in kinds else ():
        path = f"{_stem(root, rel)}.npy"
        if os.path.isfile(path):
            try:
                out["npy"] = dict(spec_of(sidecar_value(path, "npy"), path), shape=None)
                break
            except (RejectedInput, ValueError) as exc:
                first_error = first_error or exc
    if "npy" in kinds and "npy" not in out and first_error is not None:
        raise ValueError(f"no .npy sidecar can be read to fix the field's dtype, e.g. "
                         f"{first_error}")
    return out


class FieldSource:
    """The field block of input ``i``: from its sidecars, or from its list row's values
    (``values[i]``: a dict, or an error text for a list line that could not be read)."""

    def __init__(self, schema: dict, root: str = "", paths=(), values=None, targets=None):
        self.schema, self.root, self.paths, self.values = schema, root, paths, values
        self.targets = targets

    def block(self, i: int) -> bytes | None:
        """The field block, None when there are no fields; RejectedInput when input ``i``
        cannot have one."""
        if self.values is not None and isinstance(self.values[i], str):
            raise RejectedInput(self.values[i])
        if not self.schema:
            return None
        if self.values is not None:
            fields = self.values[i]
        else:
            stem = _stem(self.root, self.paths[i])
            fields = {k: sidecar_value(f"{stem}.{k}", k) for k in self.schema
                      if self.targets is None or k not in self.targets.schema}
        if self.targets is not None:
            fields = dict(fields, **self.targets.fields(i, os.path.join(self.root,
                                                                        self.paths[i])))
        try:
            return encode_fields(fields, self.schema, "")
        except ValueError as exc:
            raise RejectedInput(str(exc).lstrip(": ")) from None


def check_engine_fields(src, engine: str, inputs) -> None:
    """The Ray engine plans shards from record sizes its tasks report, without fields:
    refuse fields there rather than pack them wrong."""
    if engine == "ray" and getattr(inputs, "members", None) is not None:
        raise ValueError(f"{src}: --engine ray packs image files; samples inside tars, "
                         f"Parquet, TFRecord or RecordIO files need --engine local")
    if engine == "ray" and (inputs.fields or inputs.field_values is not None):
        raise ValueError(f"{src}: --engine ray does not pack fields yet (found "
                         f"{sorted(inputs.fields or {}) or 'list fields'}); use --engine "
                         f"local, or --fields none to pack images and labels only")



# ---- field blocks made ahead -----------------------------------------------------------------
# Field blocks made ahead, in threads, while the workers encode the images.
#
# The field block of an input (sidecars read, boxes checked, a mask PNG decoded and
# compressed: packer/targets.py) is made in the packer's parent process. Made one by one
# in the loop that writes the shards, it capped a conversion with masks at about half the
# images/s of one without (benchmarks/convert_targets.py); PIL's decoders and zlib release
# the GIL, so a few threads working ahead of the writer take that cost off its path. The
# results come back in input order, at most ``depth`` ahead, so memory stays bounded.
def field_result(source, i: int) -> tuple:
    """("ok", field block) of input ``i``, or ("reject", why): whatever goes wrong with one
    input's fields rejects that input, never ends the run."""
    try:
        return "ok", source.block(i)
    except RejectedInput as exc:
        return "reject", str(exc)
    except Exception as exc:  # noqa: BLE001  (MemoryError, RecursionError, a decoder's bug)
        return "reject", f"its fields could not be made: {type(exc).__name__}: {str(exc)[:300]}"


def fields_ahead(source, todo, threads: int, depth: int = 64):
    """Yield ``field_result(source, i)`` for each ``i`` of ``todo``, in that order, made
    by ``threads`` threads at most ``depth`` inputs ahead (0 threads: made here, in turn)."""
    if threads < 1:
        for i in todo:
            yield field_result(source, int(i))
        return
    todo = iter(todo)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dlpack-fields") as pool:
        pending: deque = deque()
        try:
            for i in todo:
                pending.append(pool.submit(field_result, source, int(i)))
                if len(pending) >= depth:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()



# ---- array shapes settled when packed --------------------------------------------------------
# The shape every record of an array field shares, found while packing, so that the
# manifest states it and the Loader stacks the field into one tensor.
#
# ``dlpack convert`` packs in one streaming pass, so a sidecar's shape (``.npy``, ``.cls``)
# is not known before the last record: each record's field block is read back for its array
# shapes as it is added (``block_shapes``), the open shard's shapes are kept with its other
# counts and journaled with it (a resumed run merges the kept shards' shapes), and the
# manifest's schema gets ``"shape"`` only when every packed record agrees (``settle``).
# A journal line without shapes (written by an older dlpack) or with malformed ones leaves
# the shapes unknown: null, as before, never a shape some record does not have.
_MAX_DIM = 2**32  # a dimension is stored as u4


def array_names(schema, skip=()) -> tuple:
    """The names of ``schema``'s array fields, sorted (empty for no schema), less those of
    ``skip``: detection targets (boxes, categories, masks), per-sample arrays never stacked
    (packer/targets.py)."""
    return tuple(sorted(n for n, s in (schema or {}).items()
                        if s["type"] == "array" and n not in skip))


def block_shapes(block, schema: dict, names: tuple) -> dict:
    """name -> shape (list) of the array fields ``names`` in a record's field ``block``."""
    spans = field_spans(block, schema, "field block")
    return {n: list(struct.unpack_from(f"<{schema[n]['ndim']}I", block, spans[n][0]))
            for n in names}


def merge_shapes(acc: dict | None, shapes: dict | None) -> dict | None:
    """``acc`` with ``shapes`` merged in: a name whose shapes differ maps to None; None
    (unknown) absorbs everything."""
    if acc is None or shapes is None:
        return None
    for name, shape in shapes.items():
        if name not in acc:
            acc[name] = shape
        elif acc[name] != shape:
            acc[name] = None
    return acc


def journaled_shapes(value) -> dict | None:
    """The shapes of a journal line (untrusted: written to disk by an earlier run); None
    when absent or malformed (then nothing is claimed)."""
    if not isinstance(value, dict):
        return None
    for name, shape in value.items():
        if not isinstance(name, str) or not (shape is None or (
                isinstance(shape, list) and len(shape) <= 32 and all(
                    isinstance(d, int) and not isinstance(d, bool) and 0 <= d < _MAX_DIM
                    for d in shape))):
            return None
    return dict(value)


def settle_shapes(schema, shapes: dict | None):
    """A copy of ``schema`` whose array fields have ``"shape"``: the one every record has
    (from ``shapes``), else null; None stays None."""
    if not schema:
        return schema
    out = {}
    for name, spec in schema.items():
        spec = dict(spec)
        if spec["type"] == "array":
            shape = None if shapes is None else shapes.get(name)
            known = spec.get("shape")  # a list's arrays are checked before packing
            spec["shape"] = shape if shape is not None and len(shape) == spec["ndim"] \
                and known in (None, shape) else None
        out[name] = spec
    return out


def without_shapes(fields) -> dict | None:
    """``fields`` with the arrays' ``shape`` left out: what must agree for an append (the
    shape is a finding about the records, not a choice)."""
    return {n: {k: v for k, v in s.items() if k != "shape"} for n, s in fields.items()} \
        if fields else None


def union_schema(base, new):
    """The schema of a data set after an append: ``new``'s (same fields as ``base``'s),
    an array keeping a shape only where the old and the new records state the same one."""
    if not new or not base:
        return new
    out = {}
    for name, spec in new.items():
        spec = dict(spec)
        if spec["type"] == "array" and spec.get("shape") != base.get(name, {}).get("shape"):
            spec["shape"] = None
        out[name] = spec
    return out
