"""The field schema of a data set whose samples carry more than an image and a label.

A format-3 manifest holds ``"fields": {name: spec}``; every record then carries one value
of every field, in a field block after its image (``fields.py`` encodes and decodes it).
A spec is ``{"type": T}`` with T one of FIELD_TYPES; arrays add ``"dtype"`` (one of
ARRAY_DTYPES), ``"ndim"`` and ``"shape"`` (the shape every record shares, or null when
records differ). Imported through :mod:`dlpack_io.reader.format`.
"""
from __future__ import annotations

import re

from dlpack_io.reader.format.spec import FormatError

# int: <i8; float: <f8; str: UTF-8 text; json: UTF-8 JSON text of any JSON value;
# bytes: opaque bytes; array: ndim x <u4 shape, then the C-order little-endian elements.
FIELD_TYPES = ("int", "float", "str", "json", "bytes", "array")
# "codec" of an array spec: its elements stored compressed (lossless), e.g. masks (issue 25)
ARRAY_CODECS = ("zlib",)
MAX_NAMES, MAX_NAME_CHARS = 100_000, 256  # an id -> name table of an integer array field
ARRAY_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64",
                "int64", "float16", "float32", "float64")
MAX_NDIM = 8
MAX_FIELDS = 256
RESERVED_NAMES = ("image", "label", "index")  # what a sample already has, or a Loader adds
FIELD_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def check_field_name(name, where: str) -> str:
    """Return ``name`` if it can name a field: an identifier of at most 64 characters that
    is not one of RESERVED_NAMES; FormatError naming ``where`` otherwise."""
    if not isinstance(name, str) or not FIELD_NAME_RE.match(name):
        raise FormatError(f"{where}: field name {name!r:.70} is not an identifier of 1..64 "
                          f"letters, digits and '_' (not starting with a digit)")
    if name in RESERVED_NAMES:
        raise FormatError(f"{where}: field name {name!r} clashes with the sample's own "
                          f"{name!r}; rename the field (e.g. {name + '_2'!r})")
    return name


def _check_array_spec(spec: dict, where: str) -> None:
    if spec.get("dtype") not in ARRAY_DTYPES:
        raise FormatError(f"{where}: dtype {spec.get('dtype')!r:.40} is not one of {ARRAY_DTYPES}")
    ndim = spec.get("ndim")
    if not isinstance(ndim, int) or isinstance(ndim, bool) or not 0 <= ndim <= MAX_NDIM:
        raise FormatError(f"{where}: ndim {ndim!r:.40}, expected an integer 0..{MAX_NDIM}")
    if "codec" in spec and spec["codec"] not in ARRAY_CODECS:
        raise FormatError(f"{where}: codec {spec['codec']!r:.40} is not one of {ARRAY_CODECS}")
    if "names" in spec:
        _check_names(spec["names"], spec["dtype"], where)
    shape = spec.get("shape")
    if shape is None:
        return
    if not isinstance(shape, list) or len(shape) != ndim or any(
            not isinstance(d, int) or isinstance(d, bool) or not 0 <= d < 2**32 for d in shape):
        raise FormatError(f"{where}: shape {shape!r:.60}, expected null or {ndim} integers "
                          f"0..{2**32 - 1}")


def _check_names(names, dtype: str, where: str) -> None:
    """An id -> name table (COCO's categories): str(int) keys, short str names."""
    if "int" not in dtype or not isinstance(names, dict) or len(names) > MAX_NAMES:
        raise FormatError(f"{where}: names must be an object of at most {MAX_NAMES} "
                          f"id -> name entries on an integer array")
    for key, name in names.items():
        if not re.fullmatch(r"-?[0-9]{1,19}", key) or not isinstance(name, str) \
                or len(name) > MAX_NAME_CHARS:
            raise FormatError(f"{where}: names entry {key!r:.30}: {name!r:.40}, expected a "
                              f"decimal id and a name of at most {MAX_NAME_CHARS} characters")


def check_field_schema(fields, where: str) -> dict:
    """Validate a manifest's ``fields`` object; return it. FormatError names the field."""
    if not isinstance(fields, dict) or len(fields) > MAX_FIELDS:
        raise FormatError(f"{where}: fields must be an object of at most {MAX_FIELDS} "
                          f"name -> spec entries")
    for name, spec in fields.items():
        at = f"{where}: fields[{name!r:.70}]"
        check_field_name(name, at)
        if not isinstance(spec, dict) or spec.get("type") not in FIELD_TYPES:
            raise FormatError(f"{at}: expected an object with type one of {FIELD_TYPES}")
        extra = set(spec) - ({"type", "dtype", "ndim", "shape", "codec", "names"}
                             if spec["type"] == "array"
                             else {"type"})
        if extra:
            raise FormatError(f"{at}: unknown keys {sorted(extra)} for type {spec['type']!r}")
        if spec["type"] == "array":
            _check_array_spec(spec, at)
    return fields
