"""``dlpack convert --list FILE``: a CSV/TSV of ``path,label`` rows (extra columns: str
fields), or JSON Lines (``.jsonl``, ``.ndjson``): one JSON object per line, ``{"path": "a/x.jpg",
"label": 3, "caption": "a cat", ...}``. ``path`` (relative to SRC) is required; ``label``
(an integer or a class name) is optional for every line or none; every other key is a
field of that name. A field's type is its values' JSON type (int, float, str; an int
field with a float anywhere becomes float; mixed types, lists, objects, booleans and null
become ``json``), with one exception: a field whose value on every line is a list of
numbers (or a rectangular nested list of them, e.g. boxes ``[[x0, y0, x1, y1], ...]``) of
one and the same shape is an ``array`` of that shape: ``int64`` when every number is an
integer that fits, else ``float64`` (JSON numbers are doubles; a float field whose
integers go beyond 2**53, where float64 stops being exact, stays ``json``: nothing is
rounded), so the Loader stacks it into one tensor. One line whose list differs (in
length, nesting, or holding a non-number, a bool, null or an empty list) keeps the whole
field ``json``. The whole list is read before anything is packed, so this is decided
before the first record is written and every record of the field has the same type.
(``boxes``, ``categories`` and ``iscrowd`` are detection targets: packer/targets.py.)
A line that is not a JSON object, lacks ``path``, names a field ``image``/``label``-like
or lacks a field other lines have is a reject naming the file and the line
(``--on-error`` applies); the rest is packed.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from dlpack_io.packer.scan import (MAX_CLASS_CHARS, MAX_LIST_LABEL, MAX_PATH_CHARS, Inputs, clipped,
                                   shown, too_long)
from dlpack_io.packer.targets import TARGET_KEYS
from dlpack_io.reader.format import FormatError
from dlpack_io.reader.format.fields import check_field_name
from dlpack_io.reader.format.schema import MAX_JSON_DEPTH, json_depth


def _parse_line(line: str, where: str, root: Path):
    """(path, label or None, fields) of one line; ValueError with the reason."""
    if json_depth(line.encode()) > MAX_JSON_DEPTH:
        raise ValueError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, found {type(obj).__name__}")
    path = obj.pop("path", None)
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}: no \"path\" (text) in the object")
    label = obj.get("label")
    for problem in (too_long(path, "a path", MAX_PATH_CHARS), too_long(
            label, "a label", MAX_CLASS_CHARS) if isinstance(label, str) else None):
        if problem:
            raise ValueError(f"{where}: {problem}")
    if "\0" in path:
        raise ValueError(f"{where}: the path holds a NUL byte (shown as \\x00)")
    if os.path.isabs(path) or ".." in Path(path).parts:
        raise ValueError(f"{where}: path {path!r} must be relative to {root} and stay inside it")
    label = obj.pop("label", None)
    if label is not None and (isinstance(label, bool) or not isinstance(label, (int, str))
                              or (isinstance(label, int) and label < 0)):
        raise ValueError(f"{where}: label {label!r:.40} is not a class name or an integer >= 0")
    if isinstance(label, int) and label > MAX_LIST_LABEL:  # classes "0".."max" are listed
        raise ValueError(f"{where}: label {str(label)[:20]} is above {MAX_LIST_LABEL}, the "
                         f"largest class number a list may use")
    for name in obj:
        try:
            check_field_name(name, where)
        except FormatError as exc:
            raise ValueError(str(exc)) from None
    return Path(path).as_posix(), label, obj


def _kind(value) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        return "json"
    return {int: "int", float: "float", str: "str"}[type(value)]


def _numbers(value):
    """(shape, holds a float, largest absolute integer) of a non-empty rectangular nested
    list of JSON numbers (bools excluded), else None. Nesting is bounded by the line's
    depth check."""
    if not isinstance(value, list) or not value:
        return None
    if all(type(x) in (int, float) for x in value):
        ints = [abs(x) for x in value if type(x) is int]
        return (len(value),), len(ints) < len(value), max(ints, default=0)
    inner = [_numbers(x) for x in value]
    if any(r is None for r in inner) or len({r[0] for r in inner}) != 1:
        return None
    return ((len(value),) + inner[0][0], any(r[1] for r in inner), max(r[2] for r in inner))


def _array_spec(values) -> dict | None:
    """The array spec of a field whose every value is a list of numbers of one shape, in
    a dtype that holds every value exactly (int64; float64, whose integers stop being
    exact beyond 2**53); None when there is none."""
    found = [_numbers(v) for v in values]
    if not found or any(r is None for r in found) or len({r[0] for r in found}) != 1:
        return None
    floats, biggest = any(r[1] for r in found), max(r[2] for r in found)
    if biggest > (2**53 if floats else 2**63 - 1):
        return None
    shape = list(found[0][0])
    return {"type": "array", "dtype": "float64" if floats else "int64", "ndim": len(shape),
            "shape": shape}


def list_schema(rows: list) -> dict:
    """name -> spec of the fields over all good rows (see the module docstring)."""
    kinds: dict = {}
    for _, _, fields in rows:
        for name, value in fields.items():
            kinds.setdefault(name, set()).add(_kind(value))
    schema = {}
    for name in sorted(kinds):
        k = kinds[name]
        kind = k.pop() if len(k) == 1 else "float" if k == {"int", "float"} else "json"
        spec = _array_spec([f[name] for _, _, f in rows if name in f]) \
            if kind == "json" and name not in TARGET_KEYS else None  # boxes: targets.py
        schema[name] = spec or {"type": kind}
    return schema


def _as_arrays(fields: dict, schema: dict) -> dict:
    """A row's values, its array fields as numpy arrays of the schema's dtype."""
    import numpy as np

    return {n: np.asarray(v, dtype=schema[n]["dtype"]) if schema[n]["type"] == "array" else v
            for n, v in fields.items()}


def _labels(rows: list, where: str):
    given = [label is not None for _, label, _ in rows]
    if any(given) and not all(given):
        raise ValueError(f"{where}: some lines have a \"label\" and some do not; give every "
                         f"line a label or none")
    if not any(given):
        return [-1] * len(rows), []
    raw = [label for _, label, _ in rows]
    if all(isinstance(v, int) for v in raw):
        return raw, [str(i) for i in range(max(raw) + 1)]
    classes = sorted({str(v) for v in raw})
    lookup = {name: i for i, name in enumerate(classes)}
    return [lookup[str(v)] for v in raw], classes


def read_jsonl(root, list_file):
    """(paths, labels, classes, schema, values) of a JSON Lines list: ``values[i]`` is the
    fields dict of input i, or the reason its line is rejected (its path then names the
    list file and line)."""
    root, list_file = Path(root), Path(list_file)
    good, entries = [], []
    with open(list_file, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{list_file}:{lineno}"
            try:
                row = _parse_line(line, where, root)
                good.append(row)
                entries.append(row + (where,))
            except ValueError as exc:
                entries.append((f"{list_file.name}:{lineno}", None, str(exc), where))
    if not good:
        raise ValueError(f"{list_file}: no usable lines; expected one JSON object per line "
                         f"with a \"path\" relative to {root}")
    schema = list_schema(good)
    labels, classes = _labels(good, str(list_file))
    it = iter(labels)
    values, out_labels = [], []
    for path, _, fields, where in entries:
        bad = isinstance(fields, str)
        out_labels.append(-1 if bad else next(it))
        missing = [] if bad else sorted(set(schema) - set(fields))
        values.append(f"{where}: no {missing[0]!r} for {path} (other lines have that field)"
                      if missing else fields if bad else _as_arrays(fields, schema))
    return [e[0] for e in entries], out_labels, classes, schema, values


def _merged(a: dict, b: dict) -> dict:
    """The spec of a field whose values have specs ``a`` and ``b``."""
    if a == b:
        return a
    if {a["type"], b["type"]} == {"int", "float"}:
        return {"type": "float"}
    if a["type"] == b["type"] == "array" and (a["dtype"], a["ndim"]) == (b["dtype"], b["ndim"]):
        return a
    return {"type": "json"}


def value_schema(rows: list) -> dict:
    """name -> spec of the fields of samples read out of other files (python and numpy
    values): the type all of them share; int and float: float; anything else mixed: json.
    An array's shape is settled when packed (fields.py)."""
    from dlpack_io.reader.format.fields import spec_of

    specs: dict = {}
    for _, _, fields in rows:
        for name, value in fields.items():
            try:
                spec = spec_of(value, name)
            except ValueError:
                spec = {"type": "json"}
            if spec["type"] == "array":
                spec = dict(spec, shape=None)
            specs[name] = _merged(specs[name], spec) if name in specs else spec
    return {name: specs[name] for name in sorted(specs)}


def _value(value, spec: dict):
    import numpy as np

    kind = spec["type"]
    if kind == "array":
        return np.asarray(value, dtype=spec["dtype"])
    if kind in ("int", "float") and not isinstance(value, (bool, str, bytes)):
        return int(value) if kind == "int" else float(value)
    return value.tolist() if kind == "json" and isinstance(value, np.ndarray) else value


def _row_label(label, classes, lookup):
    """(label index, None) or (-1, why it is not one)."""
    if label is None:
        return -1, "no label, while other samples have one"
    if lookup is not None:
        return lookup[str(label)], None
    if label < 0 or label > MAX_LIST_LABEL:
        return -1, f"label {label} is not a class number 0..{MAX_LIST_LABEL}"
    return int(label), None


def container_labels(raw: list, classes, labels: bool):
    """(labels, classes, reasons) of samples read out of other files: ``raw`` holds each
    one's label as found (int, str or None); integers are class numbers (``classes``: names
    the source gives them, else "0".."max"), text labels are class names (sorted)."""
    import numpy as np

    if not labels or all(v is None for v in raw):
        return [-1] * len(raw), [], [None] * len(raw)
    given = [v for v in raw if v is not None]
    numeric = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in given)
    lookup = None
    if not numeric:
        names = {str(v) for v in given}
        order = list(classes) if classes and names <= set(classes) else sorted(names)
        lookup, classes = {n: k for k, n in enumerate(order)}, order
    out = [_row_label(v, classes, lookup) for v in raw]
    if numeric:
        top = max((k for k, why in out if why is None), default=-1)
        classes = list(classes) if classes and top < len(classes) else \
            [str(k) for k in range(top + 1)]
    return [k for k, _ in out], classes, [why for _, why in out]


def rows_inputs(rows: list, classes, schema, labels: bool):
    """(paths, labels, classes, schema, values) of samples read out of other files (rows
    of name, label or None, fields dict or the reason the sample is a reject): the schema
    given or inferred (value_schema), values converted to it; a sample lacking a field
    others have, or a label others have, is a reject naming it."""
    good = [r for r in rows if not isinstance(r[2], str)]
    schema = value_schema(good) if schema is None else schema
    label_list, classes, whys = container_labels([r[1] for r in rows], classes, labels)
    values = []
    for (name, _, fields), why in zip(rows, whys):
        missing = [] if isinstance(fields, str) else sorted(set(schema) - set(fields))
        values.append(fields if isinstance(fields, str) else f"{name}: {why}" if why else
                      f"{name}: no {missing[0]!r}, while other samples have it" if missing
                      else {k: _value(fields[k], schema[k]) for k in schema})
    return [r[0] for r in rows], label_list, classes, schema, values


def _rows(list_file: Path):
    # undecodable bytes stay as they are (surrogate escapes): such a path still opens
    text = list_file.read_text(encoding="utf-8-sig", errors="surrogateescape")
    delimiter = "\t" if "\t" in text.split("\n", 1)[0] else ","
    for lineno, row in enumerate(csv.reader(text.splitlines(), delimiter=delimiter), 1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) < 2:
            raise ValueError(f"{list_file}:{lineno}: expected 'path{delimiter}label', "
                             f"got {delimiter.join(row)!r}")
        yield lineno, row[0].strip(), row[1].strip(), row[2:]


def read_list(root, list_file) -> Inputs:
    """Read a CSV/TSV of ``path,label`` rows; paths are relative to ``root``.

    Labels may be class names (classes = sorted unique names) or non-negative integers
    (classes = "0".."max"). A first row whose label is not numeric while the others are,
    or that reads ``path,label``, is taken as a header. Order is the list's order. A row
    that cannot be an input (a NUL in its path; in a list of integer labels, a label in
    other digits than 0-9 or above MAX_LIST_LABEL; a path or a class name longer than one
    can be) stays in the list as a reject naming its line (``Inputs.bad``): one bad row
    never stops the conversion.
    """
    root, list_file = Path(root), Path(list_file)
    if list_file.suffix.lower() in (".jsonl", ".ndjson"):
        return _read_jsonl(root, list_file)
    limit = csv.field_size_limit(2**31 - 1)  # a long field is a reject below, not an error
    try:
        rows = list(_rows(list_file))
    finally:
        csv.field_size_limit(limit)
    header = None
    if rows and rows[0][2].lower() in ("label", "class", "target"):
        header, rows = rows[0], rows[1:]
    if not rows:
        raise ValueError(f"{list_file}: no 'path,label' rows found")
    raw_labels = [label for _, _, label, _ in rows]
    bad = {}
    if all(lab.isdigit() for lab in raw_labels):  # isdigit: also other scripts' digits
        labels = [_int_label(lab, list_file, lineno, bad, k)
                  for k, (lineno, _, lab, _) in enumerate(rows)]
        classes = [str(i) for i in range(max(labels) + 1)]
    else:  # a label too long to be a class name is a reject, and no class
        bad.update((k, f"{list_file}:{lineno}: {too_long(lab, 'a label', MAX_CLASS_CHARS)}")
                   for k, (lineno, _, lab, _) in enumerate(rows) if len(lab) > MAX_CLASS_CHARS)
        classes = sorted({lab for lab in raw_labels if len(lab) <= MAX_CLASS_CHARS})
        lookup = {name: i for i, name in enumerate(classes)}
        labels = [lookup.get(lab, -1) for lab in raw_labels]
        classes = [shown(c) for c in classes]
    paths = _list_paths(rows, root, list_file, bad)
    schema, values = extra_columns(header, rows, list_file)
    return Inputs(str(root.resolve()), paths, labels, classes, str(list_file.resolve()),
                  bad=bad or None, fields=schema, field_values=values)


def _list_paths(rows, root: Path, list_file, bad: dict) -> list:
    """The paths of a CSV/TSV list's rows; a path too long or holding a NUL is a reject
    (``bad``), recorded escaped and clipped."""
    paths = []
    for k, (lineno, path, _, _) in enumerate(rows):
        if len(path) > MAX_PATH_CHARS:
            bad[k] = f"{list_file}:{lineno}: {too_long(path, 'a path', MAX_PATH_CHARS)}"
            path = clipped(shown(path))
        elif "\0" in path:
            bad[k] = f"{list_file}:{lineno}: the path holds a NUL byte (shown as \\x00)"
            path = shown(path)
        elif os.path.isabs(path) or ".." in Path(path).parts:
            raise ValueError(f"{list_file}:{lineno}: path {path!r} must be relative to {root} "
                             f"and stay inside it")
        paths.append(Path(path).as_posix())
    return paths


def _int_label(text: str, list_file, lineno: int, bad: dict, k: int) -> int:
    """The integer label of row ``k``; -1 with ``bad[k]`` set when it is not one we take."""
    if not (text.isascii() and text.isdecimal()):
        bad[k] = f"{list_file}:{lineno}: label {shown(text)!r} is not written in digits 0-9"
        return -1
    if len(text) > 9 or int(text) > MAX_LIST_LABEL:  # length first: int() of a huge text
        bad[k] = (f"{list_file}:{lineno}: label {shown(text[:20])} is above "
                  f"{MAX_LIST_LABEL}, the largest class number a list may use")
        return -1
    return int(text)


def extra_columns(header, rows, list_file):
    """(schema, values) of a CSV/TSV list's columns after path and label: str fields
    named by the header row (``column3``, ... without one); (None, None) when none."""
    width = max(len(extra) for *_, extra in rows)
    if not width:
        return None, None
    names = [n.strip() for n in header[3]] if header else []
    names += [f"column{k + 3}" for k in range(len(names), width)]
    from dlpack_io.reader.format.fields import check_field_name

    for name in names:
        check_field_name(name, f"{list_file}: header")
    values = [dict(zip(names, extra)) if len(extra) == width else
              f"{list_file}:{lineno}: {len(extra) + 2} columns, other rows have {width + 2}"
              for lineno, _, _, extra in rows]
    return {n: {"type": "str"} for n in names}, values


def _read_jsonl(root: Path, list_file: Path) -> Inputs:
    paths, labels, classes, schema, values = read_jsonl(root, list_file)
    return Inputs(str(root.resolve()), paths, labels, classes, str(list_file.resolve()),
                  fields=schema, field_values=values)
