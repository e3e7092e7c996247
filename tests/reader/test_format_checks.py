"""Every check of the on-disk format, reached by damage that passes the checksums.

Each case crafts a data set as an attacker (or a buggy writer) would: the fields are
changed and every CRC up to the manifest is recomputed (tests/crafted.py), so the check
under test, and only it, can refuse the data. Each case expects that check's own message.
docs/testing.md maps every ``raise FormatError`` / ``report.add`` of reader/format.py,
checks.py, shard.py, dataset.py, checks.py and tools/verification.py to its test.
"""
import json
import os
import shutil

import numpy as np
import pytest
from crafted import (lmdb_index_and_meta, load_manifest, read_shard, reseal_header, reseal_lmdb,
                     reseal_shard, store_lmdb_index, write_manifest)

from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.checks import check_index
from dlpack_io.reader.shard import LmdbShard, RecordShard
from dlpack_io.tools.verification import verify


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Raw-mode data sets (8x8 records, 5 per shard): record, LMDB, one of 24 records in one
    shard, one packed without labels; and a JPEG one."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("checks")
    make_image_folder(root / "src", 16, 2, seed=4, size=(24, 32))
    make_image_folder(root / "src24", 24, 2, seed=5, size=(24, 32))
    raw = dict(mode="raw", size=8, workers=1, progress=False)
    convert(root / "src", root / "raw", shard_size="1KB", **raw)
    convert(root / "src", root / "lmdb", shard_size="1KB", format="lmdb", **raw)
    convert(root / "src24", root / "raw24", shard_size="1MB", **raw)
    convert(root / "src", root / "nolabels", shard_size="1KB", labels=False, **raw)
    convert(root / "src", root / "jpeg", shard_size="1MB", workers=1, progress=False)
    return root


@pytest.fixture
def copy(packed, tmp_path):
    """copy(name) -> a private copy of one packed data set."""
    def make(name):
        dst = tmp_path / name
        shutil.copytree(packed / name, dst)
        return dst
    return make


def _refused(ds_path, match, *, verify_too=True):
    """Dataset (and every sample) refuses the data set with ``match``; verify reports it."""
    with pytest.raises(fmt.FormatError, match=match):
        ds = Dataset(ds_path)
        for i in range(len(ds)):
            ds[i]
    if verify_too:
        report = verify(ds_path, progress=False)
        assert not report.ok
        text = " | ".join(p["problem"] for p in report.problems)
        assert __import__("re").search(match, text), text


def _problems(ds_path, **kw) -> list:
    report = verify(ds_path, progress=False, **kw)
    assert not report.ok
    return [(p["where"], p["problem"]) for p in report.problems]


# ---- the header page (format.unpack_header) ------------------------------------------------
def test_intact_data_sets_pass(packed):
    """The baseline: nothing below fails because the data sets were broken to start with."""
    for name in ("raw", "lmdb", "raw24", "nolabels", "jpeg"):
        assert verify(packed / name, decode=True, progress=False).ok, name
        ds = Dataset(packed / name)
        assert all(ds[i][0].ndim == 3 for i in range(len(ds)))


def test_short_file_is_truncated(copy):
    ds = copy("raw")
    os.truncate(ds / "shard-00001.rec", 4000)
    with pytest.raises(fmt.FormatError, match=r"shard-00001.rec: file is 4000 bytes, shorter "
                                              r"than the 4096-byte header page; the shard is "
                                              r"truncated"):
        Dataset(ds)


def test_wrong_magic_with_resealed_checksum(copy):
    """The issue's mutant: a shard with another magic (checksums resealed) was accepted."""
    ds = copy("raw")
    reseal_header(ds, 1, magic=b"DLPKSHRX")
    _refused(ds, r"shard-00001.rec: magic is b'DLPKSHRX', expected b'DLPKSHRD': not a dlpack "
                 r"record shard")


def test_header_checksum(copy):
    ds = copy("raw")
    path = ds / "shard-00001.rec"
    blob = bytearray(path.read_bytes())
    blob[20] ^= 1  # num_records, CRC left stale
    path.write_bytes(bytes(blob))
    _refused(ds, r"shard-00001.rec: header checksum mismatch \(stored 0x[0-9a-f]{8}, computed "
                 r"0x[0-9a-f]{8}\): the header page is damaged")


def test_header_padding_must_be_zero(copy):
    """The header CRC covers the struct only; the padding has its own check."""
    ds = copy("raw")
    path = ds / "shard-00001.rec"
    blob = bytearray(path.read_bytes())
    blob[3000] = 7
    path.write_bytes(bytes(blob))
    _refused(ds, rf"shard-00001.rec: header padding \(bytes {fmt.HEADER_STRUCT.size}..4095\) is "
                 r"not zero: the header page is damaged")


@pytest.mark.parametrize("version,match", [
    (1, r"format version 1, this dlpack reads versions \(2, 3\) \(version 2 added EXIF "
        r"orientation and colour to the index\); re-pack it with this dlpack: dlpack convert "
        r"SRC DST --overwrite"),
    (4, r"format version 4, this dlpack reads versions \(2, 3\); upgrade dlpack \(pip install "
        r"-U dlpack-io\) to read it"),
    # a version-2 shard relabelled 3: its 32-byte index entries are not version 3's 40
    (3, r"header says index_size = 160, the layout requires 200"),
])
def test_other_format_version(copy, version, match):
    ds = copy("raw")
    reseal_header(ds, 1, version=version)
    _refused(ds, "shard-00001.rec: " + match)


# Each layout field of the header, set to a wrong value with the header CRC resealed.
LAYOUT = {
    "header_size": (lambda h: 4095, "header_size = 4095, the layout requires 4096"),
    "data_offset": (lambda h: 4160, "data_offset = 4160, the layout requires 4096"),
    "index_offset": (lambda h: h["index_offset"] + 64, "index_offset = {index_offset}, the "
                     "layout requires {expected}"),
    "index_size": (lambda h: h["index_size"] - 32, "index_size = {index_size}, the layout "
                   "requires {expected}"),
    "meta_offset": (lambda h: h["meta_offset"] - 1, "meta_offset = {meta_offset}, the layout "
                    "requires {expected}"),
    "record_align": (lambda h: 32, "record_align = 32, the layout requires 64"),
    "index_entry_size": (lambda h: 40, "index_entry_size = 40, the layout requires 32"),
    "meta_size": (lambda h: h["meta_size"] + 1, "end of the metadata = {end}, the layout "
                  "requires {size}"),
}


@pytest.mark.parametrize("field", sorted(LAYOUT))
def test_header_layout_fields(copy, field):
    ds = copy("raw")
    path = ds / "shard-00001.rec"
    h, _, _, _ = read_shard(path)
    values = dict(index_offset=h.index_offset, index_size=h.index_size,
                  meta_offset=h.meta_offset, meta_size=h.meta_size)
    new, message = LAYOUT[field]
    changed = new(values)
    reseal_header(ds, 1, **{field: changed})
    expected = {"index_offset": h.data_offset + h.data_size, "index_size": h.num_records * 32,
                "meta_offset": h.index_offset + h.index_size}.get(field)
    message = message.format(**{field: changed}, expected=expected,
                             end=h.meta_offset + h.meta_size + 1, size=path.stat().st_size)
    _refused(ds, "shard-00001.rec: header says " + message + r" \(file size \d+\); the shard is "
                 "truncated or damaged")


def test_index_table_size_is_checked():
    with pytest.raises(fmt.FormatError, match="x.rec: index table is 60 bytes, expected 2 x 32"):
        fmt.index_from_buffer(b"\0" * 60, 2, "x.rec")


# ---- the index entries (indexcheck.check_index, format.check_index_fields) -----------------
def _edit_index(ds, k, **fields):
    """Set index fields of record 2 of shard ``k`` (resealed: index CRC, header, manifest)."""
    _, data, index, meta = read_shard(ds / f"shard-{k:05d}.rec")
    for name, value in fields.items():
        index[name][2] = value
    reseal_shard(ds, k, data, index, meta, counts=False)


ENTRY = r"shard-00001.rec: record 2 \(offset \d+, length \d+, \d+x\d+x\d+, kind \d+, label -?\d+\): "
INDEX_CASES = {
    "kind": (dict(kind=4), "unknown record kind 4 \\(0 JPEG, 1 raw, 2 PNG/WebP file, 3 "
                           "decoded planes\\)"),
    "channels": (dict(channels=4), "4 channels, the format stores RGB \\(3\\)"),
    "height-0": (dict(height=0), "height and width must be 1..65535"),
    "width-65536": (dict(width=65536), "height and width must be 1..65535"),
    "empty": (dict(length=0), "empty payload"),
    "raw-size": (dict(height=4), "a raw record of 4x8x3 pixels must be 96 bytes"),
    "label": (dict(label=2), "label 2 outside the classes: expected 0..1"),
    "negative-label": (dict(label=-1), "label -1 outside the classes: expected 0..1"),
    "offset": (dict(offset=4096 + 256), "starts at 4352, the layout puts it at 4480 \\(records "
                                        "are stored in index order, back to back, 64-byte aligned\\)"),
}


@pytest.mark.parametrize("case", sorted(INDEX_CASES))
def test_index_entry_checks(copy, case):
    ds = copy("raw")
    fields, problem = INDEX_CASES[case]
    _edit_index(ds, 1, **fields)
    _refused(ds, ENTRY + problem)


def test_pixel_limit(copy):
    """A record larger than max_pixels is refused; Dataset(max_pixels=...) opts in."""
    ds = copy("raw")
    with pytest.raises(fmt.FormatError, match=ENTRY.replace("00001", "00000").replace(
            "record 2", "record 0") + "64 pixels, more than the limit of 63 \\(a "
            "decompression bomb"):
        Dataset(ds, max_pixels=63)[0]
    assert Dataset(ds, max_pixels=64)[0][0].shape == (8, 8, 3)


ORIENTATION = r"shard-00001.rec: record 2 has kind {kind}, orientation {o}, colour {c}; " \
              r"expected kind 0 \(JPEG, orientation 1..8, colour 0..2\) or 1 \(raw, " \
              r"orientation 1, colour 0\)"


@pytest.mark.parametrize("fields", [dict(orientation=0), dict(orientation=9),
                                    dict(orientation=6), dict(colour=1)])
def test_raw_records_are_upright_rgb(copy, fields):
    ds = copy("raw")
    _edit_index(ds, 1, **fields)
    _refused(ds, ORIENTATION.format(kind=1, o=fields.get("orientation", 1),
                                    c=fields.get("colour", 0)))


@pytest.mark.parametrize("fields", [dict(orientation=0), dict(orientation=9), dict(colour=3)])
def test_jpeg_records_orientation_and_colour(copy, fields):
    ds = copy("jpeg")
    _edit_index(ds, 0, **fields)
    _refused(ds, ORIENTATION.replace("00001", "00000").format(
        kind=0, o=fields.get("orientation", 1), c=fields.get("colour", 0)))


def test_records_must_cover_the_data_section(copy):
    ds = copy("raw")
    _, data, index, meta = read_shard(ds / "shard-00001.rec")
    reseal_shard(ds, 1, data + bytes(64), index, meta, counts=False)
    _refused(ds, r"shard-00001.rec: the records end at \d+, the data section at \d+: bytes no "
                 r"record covers, or records past the data section")


def test_no_labels_data_set_holds_only_minus_one(copy):
    ds = copy("nolabels")
    _edit_index(ds, 1, label=0)
    _refused(ds, ENTRY.replace("label -?", "label ") + r"label 0 outside the classes: expected "
                 r"-1 \(the data set has no classes\)")


@pytest.mark.parametrize("h,w,ok", [(1, 65535, True), (65535, 1, True), (1, 65536, False),
                                    (65536, 1, False), (0, 5, False), (5, 0, False)])
def test_side_limits_are_inclusive(h, w, ok):
    """1..65535 per side (the JPEG maximum), both ends included."""
    index = np.zeros(1, fmt.INDEX_DTYPE)
    index[0] = (4096, h * w * 3, 0, 0, h, w, 3, fmt.KIND_RAW, 1, 0)
    layout = dict(data_offset=4096, data_end=4096 + fmt.align_up(h * w * 3), num_classes=1)
    if ok:
        check_index(index, "s.rec", **layout)
    else:
        with pytest.raises(fmt.FormatError, match=r"s.rec: record 0 .*height and width must be "
                                                  r"1..65535"):
            check_index(index, "s.rec", **layout)


def test_lmdb_offsets_must_be_zero():
    index = np.zeros(2, fmt.INDEX_DTYPE)
    index[:] = (0, 192, 0, 0, 8, 8, 3, fmt.KIND_RAW, 1, 0)
    check_index(index, "s.lmdb", num_classes=1)
    index["offset"][1] = 64
    with pytest.raises(fmt.FormatError, match=r"s.lmdb: record 1 \(offset 64, .*\): LMDB index "
                                              r"entries must have offset 0"):
        check_index(index, "s.lmdb", num_classes=1)


# ---- record shards (shard.py) ---------------------------------------------------------------
def test_index_checksum_mismatch(copy):
    ds = copy("raw")
    path = ds / "shard-00001.rec"
    h, _, _, _ = read_shard(path)
    blob = bytearray(path.read_bytes())
    blob[h.index_offset + 12] ^= 1  # a label bit; the header (and its CRC) unchanged
    path.write_bytes(bytes(blob))
    _refused(ds, r"shard-00001.rec: index checksum mismatch \(stored 0x[0-9a-f]{8}, computed "
                 r"0x[0-9a-f]{8}\): the shard is damaged")


def test_metadata_checksum_mismatch(copy):
    ds = copy("raw")
    path = ds / "shard-00001.rec"
    h, _, _, _ = read_shard(path)
    blob = bytearray(path.read_bytes())
    blob[h.meta_offset + 2] ^= 1
    path.write_bytes(bytes(blob))
    with pytest.raises(fmt.FormatError, match=r"shard-00001.rec: metadata checksum mismatch"):
        RecordShard(str(path)).meta()
    assert Dataset(ds)[6][0].shape == (8, 8, 3)  # records are still readable ...
    problems = _problems(ds)  # ... but verify reads the metadata too
    assert problems == [(str(path), f"{path}: metadata checksum mismatch (stored "
                                    f"{h.meta_crc:#010x}, computed "
                                    f"{fmt.crc32(blob[h.meta_offset:]):#010x}): the shard is "
                                    f"damaged")]


def test_metadata_must_be_a_json_object(copy):
    ds = copy("raw")
    _, data, index, _ = read_shard(ds / "shard-00001.rec")
    reseal_shard(ds, 1, data, index, b"[1, 2]", counts=False)
    with pytest.raises(fmt.FormatError, match="shard-00001.rec metadata: expected a JSON object, "
                                              "found list"):
        Dataset(ds).shards[1].meta()


@pytest.mark.parametrize("how", ["swapped", "other-data-set"])
def test_record_shard_replaced_by_another_valid_one(copy, packed, how):
    """The manifest holds each shard's header CRC: a valid shard in the wrong place is
    refused when opened and by verify."""
    ds = copy("raw")
    a, b = ds / "shard-00000.rec", ds / "shard-00001.rec"
    if how == "swapped":  # same size, both intact files
        tmp = ds / "tmp"
        os.rename(a, tmp)
        os.rename(b, a)
        os.rename(tmp, b)
    else:
        shutil.copy(packed / "raw24" / "shard-00000.rec", b)
    match = (r"shard-0000[01].rec: shard checksum 0x[0-9a-f]{8} differs from the manifest's "
             r"0x[0-9a-f]{8}: the file was replaced or damaged")
    if how == "swapped":
        _refused(ds, match)
    else:  # the other file's size already differs from the manifest's
        with pytest.raises(fmt.FormatError, match=match):
            Dataset(ds)
        listed = json.loads((ds / fmt.MANIFEST_NAME).read_bytes())["shards"][1]["bytes"]
        assert listed != b.stat().st_size
        assert _problems(ds) == [(str(b), f"file is {b.stat().st_size} bytes, the manifest "
                                          f"says {listed} (truncated or appended to)")]


def test_missing_shard(copy):
    ds = copy("raw")
    os.unlink(ds / "shard-00002.rec")
    with pytest.raises(FileNotFoundError, match=r"shard-00002.rec: shard listed in the manifest "
                                                r"is missing"):
        Dataset(ds)
    assert _problems(ds) == [(str(ds / "shard-00002.rec"), "shard listed in the manifest is "
                                                            "missing")]
    shard = RecordShard(str(ds / "shard-00002.rec"))
    with pytest.raises(FileNotFoundError, match="shard-00002.rec: shard listed in the manifest"):
        shard.index


def test_shard_that_is_not_a_regular_file(copy):
    ds = copy("raw")
    os.unlink(ds / "shard-00002.rec")
    os.mkdir(ds / "shard-00002.rec")
    with pytest.raises(fmt.FormatError, match=r"shard-00002.rec: a directory, not a regular "
                                              r"file; a data set holds only regular files"):
        Dataset(ds)
    assert _problems(ds) == [(str(ds / "shard-00002.rec"), "a directory, not a regular file")]


def test_manifest_count_differs_from_the_shard(copy):
    """Counts moved between two shards (totals and tiling still consistent, resealed)."""
    ds = copy("raw")
    manifest = load_manifest(ds)
    manifest["shards"][0]["num_samples"] += 1
    manifest["shards"][1]["num_samples"] -= 1
    manifest["shards"][1]["first_sample"] += 1
    write_manifest(ds, manifest)
    with pytest.raises(fmt.FormatError, match=r"shard-00000.rec: holds 5 records, the manifest "
                                              r"says 6: the data set is damaged or its files "
                                              r"are mixed up"):
        Dataset(ds)
    assert _problems(ds) == [(str(ds / "shard-00000.rec"), "holds 5 records, the manifest says 6"),
                             (str(ds / "shard-00001.rec"), "holds 5 records, the manifest says 4")]


def _descriptors_on(path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    real, n = os.path.realpath(path), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == real
        except OSError:  # the listing's own descriptor, already closed
            pass
    return n


def test_record_shards_leave_no_descriptor_open(copy):
    """A reader opens thousands of shards over a run: the header-only count, the open and a
    refused open each close their file (the map keeps only its own descriptor)."""
    ds = copy("raw")
    good, bad = str(ds / "shard-00000.rec"), str(ds / "shard-00001.rec")
    assert RecordShard(good).record_count() == 5 and _descriptors_on(good) == 0
    shard = RecordShard(good)
    assert len(shard.payload(0)) > 0 and _descriptors_on(good) == 1  # the map's
    assert shard.record_count() == 5 and _descriptors_on(good) == 1
    del shard
    assert _descriptors_on(good) == 0
    reseal_header(ds, 1, magic=b"DLPKSHRX")
    with pytest.raises(fmt.FormatError, match=r"magic is b'DLPKSHRX'"):
        RecordShard(bad).payload(0)
    assert _descriptors_on(bad) == 0


# ---- LMDB shards (shard.py LmdbShard, lmdbcheck) --------------------------------------------
def test_lmdb_shard_swapped_for_another_valid_one(copy):
    """The issue's survivor: swapping two intact LMDB shards went unnoticed once the
    manifest checksum check was deleted. Shards 0 and 1 have the same size and count."""
    ds = copy("lmdb")
    a, b = ds / "shard-00000.lmdb", ds / "shard-00001.lmdb"
    assert a.stat().st_size == b.stat().st_size
    tmp = ds / "tmp"
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)
    _refused(ds, r"shard-0000[01].lmdb: shard checksum 0x[0-9a-f]{8} differs from the "
                 r"manifest's 0x[0-9a-f]{8}: the file was replaced or damaged")
    problems = _problems(ds)
    assert [w for w, _ in problems] == [str(a), str(b)]


def test_lmdb_shard_from_another_data_set(copy, packed, tmp_path):
    from dlpack_io.packer import convert

    other = tmp_path / "other"  # same inputs, another packing order: same sizes and counts
    convert(packed / "src", other, format="lmdb", mode="raw", size=8, shard_size="1KB", seed=9,
            workers=1, progress=False)
    ds = copy("lmdb")
    shutil.copy(other / "shard-00001.lmdb", ds / "shard-00001.lmdb")
    _refused(ds, r"shard-00001.lmdb: shard checksum 0x[0-9a-f]{8} differs from the manifest's")


def _read_in_child(shard, i, conn):
    try:
        conn.send(("ok", bytes(shard.payload(i))))
    except Exception as exc:  # the verdict goes back to the parent, which asserts on it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def test_lmdb_shard_opened_by_the_parent_reads_in_a_forked_child(packed):
    """A forked worker inherits the parent's open environment, which lmdb will not open
    twice in one process: the child closes its inherited copy and opens its own, and the
    parent's keeps working."""
    import multiprocessing as mp

    path = str(packed / "lmdb" / "shard-00001.lmdb")
    shard = LmdbShard(path)
    first = bytes(shard.payload(0))
    ctx = mp.get_context("fork")
    for i in (len(shard) - 1, 0):  # twice: a second child inherits the same stale entry
        parent_end, child_end = ctx.Pipe()
        child = ctx.Process(target=_read_in_child, args=(shard, i, child_end))
        child.start()
        assert parent_end.poll(120), "the child neither answered nor failed"
        assert parent_end.recv() == ("ok", bytes(shard.payload(i)))
        child.join(120)
        assert child.exitcode == 0
    assert bytes(shard.payload(0)) == first


def test_lmdb_payload_is_zero_copy(packed):
    """Records come back as read-only views of the map, never as copies."""
    shard = LmdbShard(str(packed / "lmdb" / "shard-00000.lmdb"))
    view = shard.payload(0)
    assert isinstance(view, memoryview) and view.readonly
    assert len(view) == int(shard.index["length"][0])


def test_lmdb_shard_that_is_not_a_regular_file(tmp_path):
    """Opened on its own (not through Dataset, which counts records first), an LMDB shard
    path that is a directory is named before lmdb sees it."""
    path = tmp_path / "shard-00000.lmdb"
    path.mkdir()
    with pytest.raises(fmt.FormatError, match=rf"{path}: a directory, not a regular file"):
        LmdbShard(str(path)).payload(0)


def test_lmdb_path_replaced_by_a_directory_is_refused_while_its_old_file_is_open(copy):
    """This process keeps the old file's environment open; a new shard object on the same
    path still looks at what the path is now."""
    ds = copy("lmdb")
    path = ds / "shard-00000.lmdb"
    old = LmdbShard(str(path))
    first = bytes(old.payload(0))
    os.rename(path, ds / "moved.lmdb")
    path.mkdir()
    with pytest.raises(fmt.FormatError, match=rf"{path}: a directory, not a regular file"):
        LmdbShard(str(path)).payload(0)
    assert bytes(old.payload(0)) == first  # the open one keeps reading what it opened


def _lmdb_case(copy, edit):
    ds = copy("lmdb")
    reseal_lmdb(ds, 1, edit)
    return ds


def test_lmdb_without_index_key(copy):
    def edit(items):
        items[b"\xff" * 8] = items.pop(fmt.LMDB_INDEX_KEY)  # same key count, no index key
    ds = _lmdb_case(copy, edit)
    _refused(ds, r"shard-00001.lmdb: LMDB shard lacks its b'__meta__' or b'__index__' key: "
                 r"incomplete or not a dlpack shard")


@pytest.mark.parametrize("key,value,shown", [("magic", "DLPKSHRX", "'DLPKSHRX'/2"),
                                             ("version", 4, "'DLPKSHRD'/4")])
def test_lmdb_magic_and_version(copy, key, value, shown):
    def edit(items):
        meta = json.loads(items[fmt.LMDB_META_KEY])
        meta[key] = value
        items[fmt.LMDB_META_KEY] = fmt.encode_meta(meta)
    ds = _lmdb_case(copy, edit)
    _refused(ds, rf"shard-00001.lmdb: magic/version {shown}, expected 'DLPKSHRD'/one of "
                 rf"\(2, 3\)")


def test_lmdb_record_count(copy):
    def edit(items):
        index, meta = lmdb_index_and_meta(items)
        meta["num_records"] = 6
        items[fmt.LMDB_META_KEY] = fmt.encode_meta(meta)
    ds = _lmdb_case(copy, edit)
    _refused(ds, r"shard-00001.lmdb: num_records 6 is not the number of record keys \(5\)")


def test_lmdb_index_checksum(copy):
    def edit(items):
        index, _ = lmdb_index_and_meta(items)
        index["label"][0] ^= 1
        items[fmt.LMDB_INDEX_KEY] = index.tobytes()  # index CRC in the metadata left stale
    ds = _lmdb_case(copy, edit)
    _refused(ds, r"shard-00001.lmdb: index checksum mismatch \(stored 0x[0-9a-f]{8}, computed "
                 r"0x[0-9a-f]{8}\): the shard is damaged")


@pytest.mark.parametrize("stored,match", [
    (2**32, r"index checksum 4294967296 is not a CRC-32"),
    (0, r"index checksum mismatch \(stored 0x00000000, computed 0x[0-9a-f]{8}\)"),  # 0 is a CRC
])
def test_lmdb_index_checksum_range(copy, stored, match):
    def edit(items):
        _, meta = lmdb_index_and_meta(items)
        meta["index_crc"] = stored
        items[fmt.LMDB_META_KEY] = fmt.encode_meta(meta)
    ds = _lmdb_case(copy, edit)
    _refused(ds, "shard-00001.lmdb: " + match)


def test_lmdb_index_checksum_missing(copy):
    def edit(items):
        _, meta = lmdb_index_and_meta(items)
        del meta["index_crc"]
        items[fmt.LMDB_META_KEY] = fmt.encode_meta(meta)
    ds = _lmdb_case(copy, edit)
    _refused(ds, r"shard-00001.lmdb: index checksum -1 is not a CRC-32")


def test_lmdb_index_table_size(copy):
    def edit(items):
        index, meta = lmdb_index_and_meta(items)
        store_lmdb_index(items, index[:4], meta)  # 4 entries for 5 records
    ds = _lmdb_case(copy, edit)
    _refused(ds, r"shard-00001.lmdb: index table is 128 bytes, expected 5 x 32")


def test_lmdb_record_length_differs_from_its_entry(copy):
    """A value longer than its (valid) index entry says: found when the record is read."""
    def edit(items):
        key = fmt.lmdb_record_key(2)
        items[key] = items[key] + bytes(24)
    ds = _lmdb_case(copy, edit)
    with pytest.raises(fmt.FormatError, match=r"shard-00001.lmdb: record 2 is missing from the "
                                              r"LMDB shard or not the length its index entry says"):
        Dataset(ds)[7]
    path = ds / "shard-00001.lmdb"
    assert _problems(ds) == [(str(path), f"{path}: record 2 is missing from the LMDB shard or "
                                         f"not the length its index entry says")]


def test_lmdb_replaced_after_its_structure_was_checked(copy):
    """The structure check is cached per file identity (device, inode, size, mtime): a file
    rewritten in place with its size and mtime restored reaches liblmdb unchecked, which
    must still end in a FormatError naming the shard, not a crash."""
    ds = copy("lmdb")
    dataset = Dataset(ds)  # checks every shard's structure (record counts)
    path = ds / "shard-00001.lmdb"
    st = path.stat()
    path.write_bytes(b"\x55" * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(fmt.FormatError, match=r"shard-00001.lmdb: not a readable LMDB shard \("):
        dataset[6]


def test_lmdb_shard_changed_in_place_is_named(copy):
    """LMDB shards have no map of their own to ask (liblmdb's): the file's size is compared."""
    from dlpack_io.reader.shard import ShardChangedError

    ds = copy("lmdb")
    dataset = Dataset(ds)
    dataset[6]  # shard 1 opened in this process
    path = ds / "shard-00001.lmdb"
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(bytes(4096))
    with pytest.raises(ShardChangedError, match=rf"shard-00001.lmdb: changed on disk while this "
                                                rf"process was reading it \({size} bytes when "
                                                rf"opened, {size + 4096} now\)"):
        dataset.check_unchanged([1])


@pytest.mark.parametrize("bad", [0, -5, 2.5, "10"])
def test_dataset_max_pixels_is_checked(packed, bad):
    with pytest.raises(ValueError, match=rf"max_pixels {bad!r}: expected a positive integer"):
        Dataset(packed / "raw", max_pixels=bad)


def test_sample_indices_are_checked(packed):
    ds = Dataset(packed / "raw")
    with pytest.raises(IndexError, match="sample 16 out of range for a data set of 16 samples"):
        ds.locate(16)
    with pytest.raises(IndexError, match="sample -17 out of range for a data set of 16 samples"):
        ds[-17]
    assert ds.locate(-1) == (3, 0) and ds.locate(5) == (1, 0)
    with pytest.raises(IndexError, match="sample -1 out of range for a data set of 16 samples"):
        ds.lookup([0, -1])
    with pytest.raises(IndexError, match="sample 99 out of range"):
        ds.lookup([99, 3])
