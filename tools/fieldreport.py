"""What ``dlpack inspect`` says about a data set's fields (format 3): the schema and, per
field, a short summary over (a spread of) the samples; and one sample's field values.
Returns plain data (``--json``) and the text the CLI prints."""
from __future__ import annotations

import numpy as np

from dlpack_io.reader.dataset import read_fields

MAX_SUMMARY_SAMPLES = 2000  # spread evenly over the data set: a summary, not a scan


def _stats(values: list) -> dict:
    return {"min": min(values), "max": max(values),
            "mean": round(sum(values) / len(values), 3)} if values else {}


def _one_field(name: str, spec: dict, values: list) -> dict:
    out = {"name": name, **spec, "count": len(values)}
    kind = spec["type"]
    if kind in ("int", "float"):
        out["value"] = _stats(values)
    elif kind in ("str", "bytes", "json"):
        out["length"] = _stats([len(v) if kind != "json" else len(str(v)) for v in values])
    else:
        shapes = {tuple(v.shape) for v in values}
        out["shapes"] = [list(s) for s in sorted(shapes)[:5]]
        out["distinct_shapes"] = len(shapes)
        sized = [v for v in values if v.size]
        out["value"] = {"min": float(min(v.min() for v in sized)),
                        "max": float(max(v.max() for v in sized))} if sized else {}
    return out


def field_summary(ds) -> dict:
    """{"schema": ..., "sampled": n, "fields": [per-field summary]} (schema only for a
    data set in object storage: its fields are not fetched)."""
    if not ds.fields:
        return {}
    if ds.is_remote or not len(ds):
        return {"schema": ds.fields, "sampled": 0, "fields": []}
    picks = np.unique(np.linspace(0, len(ds) - 1, min(len(ds), MAX_SUMMARY_SAMPLES)).astype(int))
    rows = [read_fields(ds, int(i)) for i in picks]
    return {"schema": ds.fields, "sampled": len(picks),
            "fields": [_one_field(n, ds.fields[n], [r[n] for r in rows]) for n in sorted(ds.fields)]}


def jsonable(value):
    """A field value as plain data: arrays as dtype, shape and (up to 16) values."""
    if isinstance(value, np.ndarray):
        flat = value.ravel()
        return {"dtype": value.dtype.name, "shape": list(value.shape),
                "values": flat[:16].tolist(), "truncated": flat.size > 16}
    if isinstance(value, bytes):
        return {"bytes": len(value), "head": value[:32].hex()}
    return value


def sample_fields(ds, sample: int) -> dict:
    """name -> plain-data value of every field of ``sample`` (checksum checked)."""
    return {n: jsonable(v) for n, v in read_fields(ds, sample).items()}


def _line(f: dict) -> str:
    kind = f["type"] if f["type"] != "array" else \
        f"array {f['dtype']} ndim {f['ndim']} shape {f['shape'] or 'varies'}"
    if "length" in f:
        detail = "length " + _range(f["length"])
    elif "shapes" in f:
        detail = (f"{f['distinct_shapes']} shapes, e.g. {f['shapes'][:3]}; values "
                  + _range(f["value"]))
    else:
        detail = "values " + _range(f["value"])
    return f"  {f['name']:14s} {kind}: {detail}"


def _range(s: dict) -> str:
    if not s:
        return "-"
    return f"{s['min']}..{s['max']}" + (f" (mean {s['mean']})" if "mean" in s else "")


def field_text(report: dict) -> str:
    """The lines ``dlpack inspect`` prints for field_summary()."""
    if not report:
        return "fields        none (image and label only)"
    if not report["fields"]:
        return "fields        " + ", ".join(f"{n} ({s['type']})" for n, s in report["schema"].items())
    return "\n".join([f"fields        {len(report['schema'])}, over "
                      f"{report['sampled']} samples:"] + [_line(f) for f in report["fields"]])
