"""The append's quick check (packer/appendbase.py): a packed file whose size and mtime are
those recorded is a duplicate without being hashed; --checksum hashes every file; the
record (reader/format/schema.py) is untrusted input."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from dlpack_io.packer import convert
from dlpack_io.packer.records import ConversionError
from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.schema import INPUTSTAT_NAME, MAX_INPUTSTAT_BYTES
from dlpack_io.tools.cli import main
from dlpack_io.tools.synth import make_image_folder

OPTS = dict(shard_size="40KB", workers=1, progress=False)


def _packed(tmp_path):
    """SRC of 12 images (2 classes) and its data set; the record written with it."""
    src, dst = tmp_path / "src", tmp_path / "ds"
    make_image_folder(src, 12, 2, seed=0, size=(48, 64))
    convert(src, dst, **OPTS)
    return src, dst


def _counts(result) -> tuple:
    a = result["append"]
    return a["duplicates"], a["quick"], a["hashed"], a["changed"], a["new_samples"]


def _record(dst) -> dict:
    rec = json.loads((dst / INPUTSTAT_NAME).read_bytes())
    return dict(zip(rec["paths"], zip(rec["size"], rec["mtime_ns"])))


def test_unchanged_files_are_not_hashed_and_the_record_matches_the_files(tmp_path):
    src, dst = _packed(tmp_path)
    rec = _record(dst)
    assert len(rec) == 12
    for path, (size, mtime) in rec.items():
        st = os.stat(src / path)
        assert (size, mtime) == (st.st_size, st.st_mtime_ns)
    manifest = json.loads((dst / fmt.MANIFEST_NAME).read_bytes())
    assert json.loads((dst / INPUTSTAT_NAME).read_bytes())["manifest"] == manifest["checksum"]
    make_image_folder(tmp_path / "new", 4, 2, seed=1, size=(48, 64))
    for cls in os.listdir(tmp_path / "new"):
        for name in os.listdir(tmp_path / "new" / cls):
            shutil.copy(tmp_path / "new" / cls / name, src / cls / f"n{name}")
    assert _counts(convert(src, dst, append=True, **OPTS)) == (12, 12, 0, 0, 4)
    assert len(_record(dst)) == 16  # the new inputs are recorded for the next append
    assert _counts(convert(src, dst, append=True, **OPTS)) == (16, 16, 0, 0, 0)


def test_a_touched_file_is_hashed_still_a_duplicate_and_recorded_anew(tmp_path):
    src, dst = _packed(tmp_path)
    path = sorted(_record(dst))[3]
    st = os.stat(src / path)
    os.utime(src / path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same content
    assert _counts(convert(src, dst, append=True, **OPTS)) == (12, 11, 1, 0, 0)
    assert _record(dst)[path] == (st.st_size, st.st_mtime_ns + 10**9)
    assert _counts(convert(src, dst, append=True, **OPTS)) == (12, 12, 0, 0, 0)


def test_changed_content_with_size_and_mtime_restored_needs_checksum(tmp_path):
    """rsync's trade-off, exactly: same size + same mtime is taken as unchanged."""
    src, dst = _packed(tmp_path)
    path = sorted(_record(dst))[5]
    st = os.stat(src / path)
    data = bytearray((src / path).read_bytes())
    data[len(data) // 2] ^= 0xFF  # other content, same size
    (src / path).write_bytes(bytes(data))
    os.utime(src / path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _counts(convert(src, dst, append=True, **OPTS)) == (12, 12, 0, 0, 0)
    out = convert(src, dst, append=True, checksum=True, **OPTS)
    assert _counts(out) == (11, 0, 12, 1, 0) and out["append"]["changed_paths"] == [path]
    cli = CliRunner().invoke(main, ["convert", str(src), str(dst), "--append", "--checksum",
                                    "--quiet", "--json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.output)["append"]["changed_paths"] == [path]
    cli = CliRunner().invoke(main, ["convert", str(src), str(dst), "--checksum"])
    assert cli.exit_code == 2 and "go with --append" in cli.output


def _rewrite(dst, edit) -> None:
    rec = json.loads((dst / INPUTSTAT_NAME).read_bytes())
    edit(rec)
    (dst / INPUTSTAT_NAME).write_bytes(fmt.encode_meta(rec))


def _reseal(rec) -> None:
    rec.pop("checksum")
    rec["checksum"] = fmt.crc32(fmt.encode_meta(rec))


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["size"].__setitem__(0, r["size"][0] + 1), "checksum .* does not match"),
    (lambda r: (r["size"].__setitem__(0, -1), _reseal(r)), r"entry \(.*, -1, .*\), expected"),
    (lambda r: (r["mtime_ns"].pop(), _reseal(r)), "not three lists of one length"),
    (lambda r: (r.__setitem__("version", 9), _reseal(r)), "version 9, expected"),
])
def test_a_damaged_record_is_refused_and_checksum_repairs_it(tmp_path, edit, message):
    src, dst = _packed(tmp_path)
    _rewrite(dst, edit)
    manifest = (dst / fmt.MANIFEST_NAME).read_bytes()
    with pytest.raises(ConversionError, match=f"{INPUTSTAT_NAME}: .*{message}.*--checksum"):
        convert(src, dst, append=True, **OPTS)
    assert (dst / fmt.MANIFEST_NAME).read_bytes() == manifest
    assert _counts(convert(src, dst, append=True, checksum=True, **OPTS)) == (12, 0, 12, 0, 0)
    assert _counts(convert(src, dst, append=True, **OPTS)) == (12, 12, 0, 0, 0)


def test_an_oversized_record_is_refused_unread(tmp_path):
    src, dst = _packed(tmp_path)
    with open(dst / INPUTSTAT_NAME, "r+b") as f:
        f.truncate(MAX_INPUTSTAT_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ConversionError, match=f"{INPUTSTAT_NAME}: {MAX_INPUTSTAT_BYTES + 1} "
                                              f"bytes, more than an input-stat record"):
        convert(src, dst, append=True, **OPTS)
    os.unlink(dst / INPUTSTAT_NAME)
    os.mkdir(dst / INPUTSTAT_NAME)  # not a regular file: never opened as one
    with pytest.raises(ConversionError, match=f"{INPUTSTAT_NAME}: a directory, not a regular "
                                              f"file.*--checksum"):
        convert(src, dst, append=True, **OPTS)


def test_no_record_or_a_stale_one_falls_back_to_hashing(tmp_path):
    src, dst = _packed(tmp_path)
    _rewrite(dst, lambda r: (r.__setitem__("manifest", r["manifest"] ^ 1), _reseal(r)))
    assert _counts(convert(src, dst, append=True, **OPTS)) == (12, 0, 12, 0, 0)
    os.unlink(dst / INPUTSTAT_NAME)  # a data set packed before the record existed
    assert _counts(convert(src, dst, append=True, **OPTS)) == (12, 0, 12, 0, 0)
    assert _counts(convert(src, dst, append=True, **OPTS)) == (12, 12, 0, 0, 0)
    convert(src, dst, overwrite=True, **OPTS)  # a conversion over it writes its own
    assert _counts(convert(src, dst, append=True, **OPTS)) == (12, 12, 0, 0, 0)


def test_the_quick_check_works_on_s3(s3_env, tmp_path):
    from dlpack_io.reader.remote.storage import Store

    src = tmp_path / "src"
    make_image_folder(src, 12, 2, seed=0, size=(48, 64))
    url = "s3://dlpack-test/append/quick"
    convert(src, url, **OPTS)
    store = Store(url)
    assert sorted(json.loads(store.get(INPUTSTAT_NAME))["paths"]) == \
        sorted(f"{c}/{n}" for c in os.listdir(src) for n in os.listdir(src / c))
    path = sorted(json.loads(store.get(INPUTSTAT_NAME))["paths"])[0]
    st = os.stat(src / path)
    os.utime(src / path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert _counts(convert(src, url, append=True, **OPTS)) == (12, 11, 1, 0, 0)
    assert _counts(convert(src, url, append=True, **OPTS)) == (12, 12, 0, 0, 0)
    store.put(INPUTSTAT_NAME, b'{"kind": 1}')
    with pytest.raises(ConversionError, match="inputstat.json: kind 1 version None"):
        convert(src, url, append=True, **OPTS)
    assert _counts(convert(src, url, append=True, checksum=True, **OPTS)) == (12, 0, 12, 0, 0)
