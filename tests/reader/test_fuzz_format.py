"""Fuzz the header, index, shard and manifest parsers with hypothesis, against an oracle.

Each test knows what its damage is and which check must refuse it: a small, independent
model of the spec (docs/FORMAT.md; the order of the checks included) says which error
message the parser must give, or that the input is valid and every read must be correct
(every payload exactly as long as its index entry, inside the file). A FormatError from
another check than the expected one fails, as does a crash, a hang, a huge allocation or
a read outside the mapped file. Runs with more examples when DLPACK_FUZZ_EXAMPLES is set
(the sustained run, see docs/reliability.md). Derandomised: the same examples every run.
"""
import json
import os
import re
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlpack_io.packer import convert
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.checks import check_index
from dlpack_io.reader.shard import LmdbShard, RecordShard

EXAMPLES = int(os.environ.get("DLPACK_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def shard_files(image_folder, tmp_path_factory):
    out = {}
    for data_format in ("record", "lmdb"):
        dst = tmp_path_factory.mktemp(f"fuzz_{data_format}")
        convert(image_folder, dst / "ds", format=data_format, shard_size="1MB", workers=0,
                progress=False)
        name = "shard-00000." + ("rec" if data_format == "record" else "lmdb")
        out[data_format] = ((dst / "ds" / name).read_bytes(), (dst / "ds" / "manifest.json").read_bytes())
    return out


def _read_everything(shard) -> None:
    index = shard.index
    for j in range(len(index)):
        payload = shard.payload(j)
        if len(payload) != int(index["length"][j]):
            raise AssertionError(f"short read of record {j}: {len(payload)} bytes")
    shard.meta()


def _outcome(path, cls):
    """None when the shard opens and reads completely, else the FormatError's message."""
    try:
        _read_everything(cls(str(path)))
    except fmt.FormatError as exc:
        return str(exc)
    return None


def _expect(outcome, expected) -> None:
    """``expected`` None: the parse must succeed; else a regex the error must match."""
    if expected is None:
        assert outcome is None, f"valid input refused: {outcome}"
    else:
        assert outcome is not None, f"damage not refused; expected {expected!r}"
        assert re.search(expected, outcome), f"refused by the wrong check: {outcome!r}, " \
                                             f"expected {expected!r}"


# ---- an independent model of the header checks (format.unpack_header) ------------------
HEADER_FIELDS = ("magic", "version", "header_size", "num_records", "data_offset", "data_size",
                 "index_offset", "index_size", "meta_offset", "meta_size", "record_align",
                 "index_entry_size", "index_crc", "meta_crc", "header_crc")


def header_problem(page: bytes, size: int):
    """The message regex unpack_header must raise for this page and file size, or None."""
    if size < 4096:
        return "shorter than the 4096-byte header page"
    f = dict(zip(HEADER_FIELDS, struct.unpack_from("<8sIIQQQQQQQIIIII", page)))
    if f["magic"] != b"DLPKSHRD":
        return r"magic is b.*, expected b'DLPKSHRD'"
    if fmt.crc32(page[:88]) != f["header_crc"]:
        return "header checksum mismatch"
    if any(page[92:4096]):
        return "header padding"
    if f["version"] not in (2, 3):
        return rf"format version {f['version']}, this dlpack reads versions \(2, 3\)"
    entry = 40 if f["version"] == 3 else 32  # format 3: fields_length + fields_crc
    layout = [("header_size", f["header_size"], 4096), ("data_offset", f["data_offset"], 4096),
              ("index_offset", f["index_offset"], f["data_offset"] + f["data_size"]),
              ("index_size", f["index_size"], f["num_records"] * entry),
              ("meta_offset", f["meta_offset"], f["index_offset"] + f["index_size"]),
              ("record_align", f["record_align"], 64), ("index_entry_size", f["index_entry_size"], entry),
              ("end of the metadata", f["meta_offset"] + f["meta_size"], size)]
    for name, found, expected in layout:
        if found != expected:
            return f"header says {name} = {found}, the layout requires {expected}"
    return None


def _unpack(page, size):
    try:
        h = fmt.unpack_header(page, size, "x")
    except fmt.FormatError as exc:
        return str(exc), None
    return None, h


@FUZZ
@given(prefix=st.binary(min_size=0, max_size=fmt.HEADER_STRUCT.size + 8),
       size=st.integers(0, 2**64 - 1))
def test_fuzz_header_random_bytes(prefix, size):
    page = prefix.ljust(fmt.HEADER_SIZE, b"\0")[:fmt.HEADER_SIZE]
    error, _ = _unpack(page, size)
    _expect(error, header_problem(page, size))


u64 = st.sampled_from([0, 1, 32, 4096, 2**31, 2**32, 2**63, 2**64 - 1]) | st.integers(0, 2**64 - 1)
u32 = st.sampled_from([0, 1, 32, 64, 4096, 2**32 - 1]) | st.integers(0, 2**32 - 1)


@st.composite
def header_fields(draw):
    """Header fields, most of them consistent (so the later checks are reached too)."""
    n = draw(st.sampled_from([0, 1, 3, 2**20]) | st.integers(0, 2**40))
    data_size = draw(st.sampled_from([0, 64, 4096]) | u64)
    fields = {"magic": draw(st.sampled_from([fmt.MAGIC] * 5 + [b"DLPKSHRX"])),
              "version": draw(st.sampled_from([2] * 5 + [1, 3])), "header_size": 4096,
              "num_records": n, "data_offset": 4096, "data_size": data_size,
              "index_offset": 4096 + data_size, "index_size": 32 * n,
              "meta_offset": 4096 + data_size + 32 * n, "meta_size": draw(u64 | st.just(7)),
              "record_align": 64, "index_entry_size": 32, "index_crc": draw(u32),
              "meta_crc": draw(u32)}
    for name in draw(st.lists(st.sampled_from(HEADER_FIELDS[2:14]), max_size=2)):
        fields[name] = draw(u32 if name in ("record_align", "index_entry_size", "index_crc",
                                            "meta_crc", "header_size") else u64)
    return fields


@FUZZ
@given(fields=header_fields(), size_choice=st.sampled_from(["exact", "exact", "other"]),
       other=u64)
def test_fuzz_header_fields_with_valid_checksum(fields, size_choice, other):
    """Self-consistent checksums but hostile counts and offsets: the first broken rule of
    the layout is the one reported."""
    wrap = {k: v % 2**32 if k in ("version", "header_size", "record_align", "index_entry_size",
                                  "index_crc", "meta_crc") else v % 2**64 for k, v in fields.items()
            if k != "magic"}
    values = [fields["magic"]] + [wrap[k] for k in HEADER_FIELDS[1:14]]
    body = fmt.HEADER_STRUCT.pack(*values, 0)[:-4]
    page = (body + struct.pack("<I", fmt.crc32(body))).ljust(fmt.HEADER_SIZE, b"\0")
    size = wrap["meta_offset"] + wrap["meta_size"] if size_choice == "exact" else other
    error, h = _unpack(page, size)
    _expect(error, header_problem(page, size))
    if h is not None:
        assert h.meta_offset + h.meta_size == size
        assert h.index_size == h.num_records * fmt.INDEX_ENTRY_SIZE


# ---- whole record shards: flips, truncations, words written anywhere ------------------------
mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**7), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10**7), st.just(0)),
    st.tuples(st.just("u64"), st.sampled_from([16, 24, 32, 40, 48, 56, 64]),
              st.sampled_from([0, 1, 4095, 4096, 2**31, 2**32 + 7, 2**63, 2**64 - 1])),
    st.tuples(st.just("index_u64"), st.integers(0, 200), st.sampled_from([0, 2**40, 2**64 - 1])),
)


def _mutate(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for kind, a, b in mutations:
        if not buf:
            break
        if kind == "flip":
            buf[a % len(buf)] ^= b
        elif kind == "truncate":
            del buf[a % len(buf):]
        elif kind == "u64" and len(buf) >= a + 8:
            buf[a:a + 8] = struct.pack("<Q", b)
        elif kind == "index_u64" and len(buf) >= fmt.HEADER_SIZE:
            pos = len(buf) - 600 - 8 * a  # somewhere in the index/meta tail
            if pos > 0:
                buf[pos:pos + 8] = struct.pack("<Q", b)
    return bytes(buf)


def shard_problem(original: bytes, damaged: bytes):
    """Which check must refuse ``damaged`` (a damaged copy of the intact shard ``original``),
    in the order RecordShard applies them; None for damage that only the record CRCs (that
    verify checks) can see, or no damage at all."""
    h = fmt.unpack_header(original[:fmt.HEADER_SIZE], len(original), "x")
    page = damaged[:fmt.HEADER_SIZE].ljust(fmt.HEADER_SIZE, b"\0")
    expected = header_problem(page, len(damaged))
    if expected is not None:
        return expected
    if damaged[h.index_offset:h.meta_offset] != original[h.index_offset:h.meta_offset]:
        return "index checksum mismatch"
    if damaged[h.meta_offset:] != original[h.meta_offset:]:
        return "metadata checksum mismatch"
    return None


@FUZZ
@given(mutations=st.lists(mutation, min_size=1, max_size=4))
def test_fuzz_record_shard(shard_files, tmp_path, mutations):
    original = shard_files["record"][0]
    damaged = _mutate(original, mutations)
    path = tmp_path / "shard-00000.rec"
    path.write_bytes(damaged)
    expected = shard_problem(original, damaged)
    _expect(_outcome(path, RecordShard), expected)
    if expected is None and damaged != original:  # only data bytes changed: records differ
        shard = RecordShard(str(path))
        assert any(fmt.crc32(shard.payload(j)) != int(shard.index["crc"][j])
                   for j in range(len(shard.index))) or \
            _padding_changed(original, damaged, shard)


def _padding_changed(original, damaged, shard) -> bool:
    """Bytes between records (alignment padding) differ: verify's padding check sees it."""
    index, end = shard.index, shard.header.index_offset
    covered = np.zeros(end, dtype=bool)
    for o, n in zip(index["offset"].tolist(), index["length"].tolist()):
        covered[o:o + n] = True
    diff = np.frombuffer(original[:end], np.uint8) != np.frombuffer(damaged[:end], np.uint8)
    return bool(np.any(diff & ~covered))


# ---- index entries: an independent per-entry model of indexcheck.check_index -------------
def index_problem(index, data_offset, data_end, num_classes=None,
                  max_pixels=fmt.DEFAULT_MAX_PIXELS):
    """The message regex check_index must raise (checks in its order, first record of the
    first failing check), or None; plain Python ints, one entry at a time."""
    rows = [{k: int(e[k]) for k in fmt.INDEX_DTYPE.names} for e in index]
    checks = [
        (lambda e: e["kind"] > 3, "unknown record kind"),
        (lambda e: e["channels"] != 3, "channels, the format stores RGB"),
        (lambda e: not (1 <= e["height"] <= 65535 and 1 <= e["width"] <= 65535),
         "height and width must be 1..65535"),
        (lambda e: e["length"] < 1, "empty payload"),
        (lambda e: e["height"] * e["width"] > max_pixels, "pixels, more than the limit"),
        (lambda e: e["kind"] == 1 and e["height"] * e["width"] * 3 != e["length"],
         "a raw record of"),
        (lambda e: not 1 <= e["orientation"] <= 8 or e["colour"] > 2 or
         (e["kind"] in (1, 2) and (e["orientation"] != 1 or e["colour"] != 0)) or
         (e["kind"] == 3 and e["colour"] == 2),  # planes: YCbCr or grey, never CMYK
         "has kind .*, orientation .*, colour .*; expected kind 0"),
    ]
    for bad, message in checks:
        for i, e in enumerate(rows):
            if bad(e):
                return f"record {i}.*{message}"
    expected = data_offset
    for i, e in enumerate(rows):
        if e["offset"] != expected:
            return f"record {i} .*starts at {e['offset']}, the layout puts it at {expected}"
        expected = -(-(expected + e["length"]) // 64) * 64
    if expected != data_end:
        return f"the records end at {expected}, the data section at {data_end}"
    if num_classes is not None:
        for i, e in enumerate(rows):
            if not 0 <= e["label"] < num_classes:
                return f"record {i} .*label {e['label']} outside the classes"
    return None


FAULTS = {"kind": [4, 255], "channels": [1, 4], "height": [0, 65536], "width": [0, 2**32 - 1],
          "length": [0], "pixels": [10_000], "raw_length": [1], "orientation": [0, 9, 6],
          "colour": [3, 1], "offset": [64], "label": [3, -1]}


@st.composite
def index_tables(draw):
    """Valid index tables with 0 to 2 hostile fields (so every check is reached)."""
    num = draw(st.integers(0, 12))
    index = np.zeros(num, fmt.INDEX_DTYPE)
    for i in range(num):
        kind = draw(st.sampled_from([fmt.KIND_JPEG, fmt.KIND_RAW]))
        h, w = draw(st.integers(1, 300)), draw(st.integers(1, 300))
        jpeg = kind == fmt.KIND_JPEG
        index[i] = (0, draw(st.integers(1, 5000)) if jpeg else h * w * 3,
                    draw(st.integers(0, 2)), 0, h, w, 3, kind,
                    draw(st.integers(1, 8)) if jpeg else 1, draw(st.integers(0, 2)) if jpeg else 0)
    index["offset"], end = fmt.record_offsets(index["length"], 4096)
    count = draw(st.sampled_from([0, 1, 1, 1, 2])) if num else 0
    for fault in [draw(st.sampled_from(sorted(FAULTS))) for _ in range(count)]:
        i, value = draw(st.integers(0, num - 1)), draw(st.sampled_from(FAULTS[fault]))
        if fault == "pixels":
            index["height"][i] = index["width"][i] = value
        elif fault == "raw_length":
            index["length"][i] += value
        elif fault == "offset":
            index["offset"][i] += value
        else:
            index[fault][i] = value
    return index, end + draw(st.sampled_from([0, 0, 0, 0, 64]))


@FUZZ
@given(table=index_tables())
def test_fuzz_index_tables(table):
    index, end = table
    try:
        check_index(index, "x", data_offset=4096, data_end=end, num_classes=3)
        error = None
    except fmt.FormatError as exc:
        error = str(exc)
    _expect(error, index_problem(index, 4096, end, num_classes=3))


@FUZZ
@given(num=st.integers(0, 50), data=st.data())
def test_fuzz_index_random_bytes(num, data):
    raw = data.draw(st.binary(min_size=num * 32, max_size=num * 32))
    index = fmt.index_from_buffer(raw, num, "x")
    end = data.draw(st.integers(4096, 2**40))
    try:
        check_index(index, "x", data_offset=4096, data_end=end, num_classes=3)
        error = None
    except fmt.FormatError as exc:
        error = str(exc)
    _expect(error, index_problem(index, 4096, end, num_classes=3))


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 100), st.sampled_from(
    ["offset", "length", "height", "width", "channels", "kind", "label", "orientation",
     "colour"]), u64), min_size=1, max_size=4))
def test_fuzz_index_entries_with_resealed_checksums(shard_files, tmp_path, edits):
    """Hostile index entries whose CRCs were recomputed: the index checks are the last
    line, and the first broken rule is the one reported."""
    data = bytearray(shard_files["record"][0])
    h = fmt.unpack_header(bytes(data[:fmt.HEADER_SIZE]), len(data), "x")
    index = np.frombuffer(bytes(data[h.index_offset:h.meta_offset]), fmt.INDEX_DTYPE).copy()
    for row, field, value in edits:
        info = np.iinfo(fmt.INDEX_DTYPE[field])
        index[field][row % len(index)] = value % (int(info.max) + 1) if info.min == 0 else \
            (value % 2**31) - (2**30)
    raw = index.tobytes()
    page, _ = fmt.pack_header(h.num_records, h.data_size, h.meta_size, fmt.crc32(raw), h.meta_crc)
    data[h.index_offset:h.meta_offset] = raw
    data[:fmt.HEADER_SIZE] = page
    path = tmp_path / "shard-00000.rec"
    path.write_bytes(bytes(data))
    _expect(_outcome(path, RecordShard), index_problem(index, h.data_offset, h.index_offset))


# ---- manifests ------------------------------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)

# key -> what a refusal of a bad value for it must mention
NAMES = {
    "kind": r"'kind'|kind is", "version": r"'version'|format version",
    "format": r"'format'|format .* / mode", "mode": r"'mode'|format .* / mode",
    "num_samples": r"'num_samples'|num_samples says", "num_bytes": r"'num_bytes'",
    "classes": r"'classes'|classes\[\d+\]|classes but", "options": r"'options'",
    "class_counts": r"'class_counts'|class_counts\[\d+\]|class counts",
    "shards": r"'shards'|shards\[\d+\]|shards hold|listed twice", "source": r"'source'|source must",
    "rejects": r"'rejects'|rejects\[\d+\]", "reencoded": r"'reencoded'|reencoded\[\d+\]",
    "lossless": r"'lossless'", "created": r"'created'",
    "checksum": r"'checksum'|manifest checksum mismatch",
    "shards.0.name": r"shards\[0\].*(shard name|not a record shard|'name')|listed twice",
    "shards.0.num_samples": r"shards\[0\]: field 'num_samples'|shards\[1\]: first_sample|"
                            r"shards hold",
    "shards.0.crc": r"shards\[0\]: (field 'crc'|crc \d+ is not a 32-bit checksum)",
    "shards.0": r"shards\[0\]|shards\[1\]: first_sample|shards hold|listed twice",
}


@FUZZ
@given(key=st.sampled_from(sorted(fmt.MANIFEST_FIELDS) + ["shards.0.name", "shards.0.num_samples",
                                                          "shards.0.crc", "shards.0", "extra"]),
       value=json_values)
def test_fuzz_manifest_fields(shard_files, key, value):
    """One field of a real manifest replaced by any JSON value, the checksum resealed
    (except for the checksum itself): refused naming that field, or still consistent."""
    manifest = json.loads(shard_files["record"][1])
    target, last = manifest, key
    if key.startswith("shards.0"):
        parts = key.split(".")
        target, last = (manifest["shards"], 0) if len(parts) == 2 else (manifest["shards"][0], parts[2])
    target[last] = value
    manifest["checksum"] = fmt.manifest_checksum(manifest) if key != "checksum" else value
    try:
        fmt.validate_manifest(manifest, "m")
    except fmt.FormatError as exc:
        assert key != "extra", f"an unknown extra key was refused: {exc}"
        assert re.search(NAMES[key], str(exc)), f"{key}={value!r:.80}: {exc}"
        return
    assert manifest["num_samples"] == sum(s["num_samples"] for s in manifest["shards"])
    assert len(manifest["classes"]) == len(manifest["class_counts"])


@FUZZ
@given(data=st.binary(max_size=300) | st.sampled_from([b"{}", b'{"kind": 1}', b"[]", b"7"]))
def test_fuzz_manifest_bytes(data):
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        expected = "not valid UTF-8 JSON"
    else:
        expected = "expected a JSON object" if not isinstance(value, dict) else \
            "missing required field 'kind'" if "kind" not in value else "field 'kind' is|kind is"
    with pytest.raises(fmt.FormatError, match=expected):
        fmt.validate_manifest(fmt.decode_json(data, "m"), "m")


# ---- LMDB shards cut short ----------------------------------------------------------------
@FUZZ
@given(cut=st.integers(0, 10**7))
def test_fuzz_lmdb_truncation(shard_files, tmp_path, cut):
    original = shard_files["lmdb"][0]
    damaged = original[:cut % len(original)]
    path = tmp_path / f"shard-{len(os.listdir(tmp_path)):05d}.lmdb"  # lmdb: one open per path
    path.write_bytes(damaged)
    psize = struct.unpack_from("<I", original, 40)[0]
    metas = [struct.unpack_from("<QQ", original, o + 136) for o in (0, psize)]  # last, txn id
    last = metas[1][0] if metas[0][1] < metas[1][1] else metas[0][0]  # liblmdb's pick
    if len(damaged) < psize + 152:
        expected = r"not an LMDB file \(shorter than its meta pages\)"
    elif len(damaged) < (last + 1) * psize:
        expected = rf"LMDB file is {len(damaged)} bytes but its pages reach {(last + 1) * psize}"
    else:
        expected = None  # only unused space after the last page was cut
    _expect(_outcome(path, LmdbShard), expected)
