"""Fuzz the header, index, shard and manifest parsers with hypothesis.

The only outcomes allowed: a clean FormatError (or FileNotFoundError), or a read that is
correct (every payload exactly as long as its index entry, inside the file). Never a crash,
a hang, a huge allocation or a read outside the mapped file. Runs with more examples when
DLPACK_FUZZ_EXAMPLES is set (the sustained run, see docs/reliability.md).
"""
import json
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlpack_io.packer import convert
from dlpack_io.reader import format as fmt
from dlpack_io.reader.indexcheck import check_index
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


def _check_parse(path, cls) -> None:
    try:
        _read_everything(cls(str(path)))
    except (fmt.FormatError, FileNotFoundError):
        pass


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


@FUZZ
@given(mutations=st.lists(mutation, min_size=1, max_size=4))
def test_fuzz_record_shard(shard_files, tmp_path, mutations):
    path = tmp_path / "shard-00000.rec"
    path.write_bytes(_mutate(shard_files["record"][0], mutations))
    _check_parse(path, RecordShard)


def _unpack_or_format_error(page, size):
    try:
        h = fmt.unpack_header(page, size, "x")
    except fmt.FormatError:
        return
    assert h.meta_offset + h.meta_size == size
    assert h.index_size == h.num_records * fmt.INDEX_ENTRY_SIZE


@FUZZ
@given(prefix=st.binary(min_size=0, max_size=fmt.HEADER_STRUCT.size + 8),
       size=st.integers(0, 2**64 - 1))
def test_fuzz_header_random_bytes(prefix, size):
    _unpack_or_format_error(prefix.ljust(fmt.HEADER_SIZE, b"\0")[:fmt.HEADER_SIZE], size)


u64 = st.sampled_from([0, 1, 32, 4096, 2**31, 2**32, 2**63, 2**64 - 1]) | st.integers(0, 2**64 - 1)
u32 = st.sampled_from([0, 1, 32, 64, 4096, 2**32 - 1]) | st.integers(0, 2**32 - 1)


@FUZZ
@given(fields=st.tuples(st.sampled_from([fmt.MAGIC, b"DLPKSHRX"]), st.sampled_from([1, 2]),
                        u32, u64, u64, u64, u64, u64, u64, u64, u32, u32, u32, u32),
       size=u64)
def test_fuzz_header_fields_with_valid_checksum(fields, size):
    """Self-consistent checksums but hostile counts and offsets: layout checks must hold."""
    body = fmt.HEADER_STRUCT.pack(*fields, 0)[:-4]
    page = (body + struct.pack("<I", fmt.crc32(body))).ljust(fmt.HEADER_SIZE, b"\0")
    _unpack_or_format_error(page, size)


@FUZZ
@given(num=st.integers(0, 50), data=st.data())
def test_fuzz_index_bounds(num, data):
    raw = data.draw(st.binary(min_size=num * 32, max_size=num * 32))
    index = fmt.index_from_buffer(raw, num, "x")
    end = data.draw(st.integers(4096, 2**40))
    try:
        check_index(index, "x", data_offset=4096, data_end=end, num_classes=3)
    except fmt.FormatError:
        return
    previous_end = 4096
    for entry in index:  # in order, disjoint, inside, only padding between, sizes bounded
        o, n = int(entry["offset"]), int(entry["length"])
        assert o == fmt.align_up(previous_end) and n >= 1 and o + n <= end
        assert 1 <= int(entry["height"]) * int(entry["width"]) <= fmt.DEFAULT_MAX_PIXELS
        assert 0 <= int(entry["label"]) < 3 and entry["channels"] == 3
        previous_end = o + n
    assert fmt.align_up(previous_end) == end


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


@FUZZ
@given(key=st.sampled_from(sorted(fmt.MANIFEST_FIELDS) + ["shards.0.name", "shards.0.num_samples",
                                                          "shards.0.crc", "shards.0", "extra"]),
       value=json_values)
def test_fuzz_manifest_fields(shard_files, key, value):
    manifest = json.loads(shard_files["record"][1])
    target, last = manifest, key
    if key.startswith("shards.0"):
        parts = key.split(".")
        target, last = (manifest["shards"], 0) if len(parts) == 2 else (manifest["shards"][0], parts[2])
    target[last] = value
    manifest["checksum"] = fmt.manifest_checksum(manifest) if key != "checksum" else value
    try:
        fmt.validate_manifest(manifest, "m")
    except fmt.FormatError:
        return
    assert manifest["num_samples"] == sum(s["num_samples"] for s in manifest["shards"])


@FUZZ
@given(data=st.binary(max_size=300))
def test_fuzz_manifest_bytes(data):
    try:
        fmt.validate_manifest(fmt.decode_json(data, "m"), "m")
    except fmt.FormatError:
        pass


@FUZZ
@given(mutations=st.lists(st.tuples(st.just("truncate"), st.integers(0, 10**7), st.just(0)), max_size=1))
def test_fuzz_lmdb_truncation(shard_files, tmp_path, mutations):
    path = tmp_path / f"shard-{len(os.listdir(tmp_path)):05d}.lmdb"  # lmdb: one open per path
    path.write_bytes(_mutate(shard_files["lmdb"][0], mutations))
    _check_parse(path, LmdbShard)


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 100), st.sampled_from(
    ["offset", "length", "height", "width", "channels", "kind", "label"]), u64), min_size=1, max_size=4))
def test_fuzz_index_entries_with_resealed_checksums(shard_files, tmp_path, edits):
    """Hostile index entries whose CRCs were recomputed: bounds checks are the last line."""
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
    _check_parse(path, RecordShard)
