"""dlpack convert: round trips, labels, odd inputs, options, DST safety."""
import io
import os

import numpy as np
import pytest
from PIL import Image

from dlpack_io.packer import convert
from dlpack_io.packer.journal import DstLock
from dlpack_io.packer.records import ConversionError
from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt
from dlpack_io.tools.inspection import record_detail

from helpers import dataset_fingerprint

FAST = dict(workers=0, progress=False)


def _source_pixels(root, rel):
    img = Image.open(os.path.join(root, rel))
    return np.asarray(img.convert("RGB"))


@pytest.mark.parametrize("data_format", ["record", "lmdb"])
@pytest.mark.parametrize("mode", ["jpeg", "raw"])
def test_round_trip_pixels_and_labels(image_folder, tmp_path, data_format, mode):
    dst = tmp_path / "ds"
    result = convert(image_folder, dst, format=data_format, mode=mode, shard_size="30KB", **FAST)
    ds = Dataset(dst, verify_checksums=True)
    assert len(ds) == 24 == result["num_samples"]
    assert ds.classes == ["class_00", "class_01", "class_02"]
    assert result["num_shards"] == len(ds.shards) > 1
    seen = set()
    labels = ds.labels
    assert labels.dtype == np.int64 and labels.shape == (24,)
    for i in range(len(ds)):
        pixels, label = ds[i]
        assert labels[i] == label == int(ds.record(i)[1]["label"])
        rel = record_detail(dst, i)["source"]
        seen.add(rel)
        assert rel.startswith(ds.classes[label] + "/")
        np.testing.assert_array_equal(pixels, _source_pixels(image_folder, rel))
    assert len(seen) == 24


def test_jpeg_mode_keeps_original_bytes(image_folder, tmp_path):
    result = convert(image_folder, tmp_path / "ds", jpeg_restarts=False, **FAST)
    assert result["lossless"] == {} and result["reencoded"] == {}
    ds = Dataset(tmp_path / "ds")
    for i in range(len(ds)):
        payload, _ = ds.record(i)
        rel = record_detail(tmp_path / "ds", i)["source"]
        assert bytes(payload) == (image_folder / rel).read_bytes()


def test_default_adds_restart_markers_and_keeps_everything_else(image_folder, tmp_path):
    """The default jpeg-mode record: the original bytes up to the scan, a DRI segment,
    then the rewritten scan; the same pixels; counted as a lossless transform."""
    from dlpack_io.reader.jpegdecode import have_extension

    result = convert(image_folder, tmp_path / "ds", **FAST)
    if not have_extension():
        assert result["lossless"] == {}
        return
    assert result["lossless"] == {"restart markers added (lossless)": 24}
    ds = Dataset(tmp_path / "ds")
    assert ds.manifest["options"]["jpeg_restarts"] is True
    for i in range(len(ds)):
        payload = bytes(ds.record(i)[0])
        original = (image_folder / record_detail(tmp_path / "ds", i)["source"]).read_bytes()
        sos = original.find(b"\xff\xda")
        assert payload[:sos] == original[:sos] and payload[sos:sos + 2] == b"\xff\xdd"
        np.testing.assert_array_equal(ds[i][0], np.asarray(Image.open(io.BytesIO(original))))


def test_raw_fixed_size_is_dense(image_folder, tmp_path):
    convert(image_folder, tmp_path / "ds", mode="raw", size=32, **FAST)
    ds = Dataset(tmp_path / "ds")
    assert {ds[i][0].shape for i in range(len(ds))} == {(32, 32, 3)}


def test_max_side_bounds_jpeg_and_raw(image_folder, tmp_path):
    for mode in ("jpeg", "raw"):
        result = convert(image_folder, tmp_path / mode, mode=mode, max_side=40, **FAST)
        ds = Dataset(tmp_path / mode)
        assert max(max(ds[i][0].shape[:2]) for i in range(len(ds))) == 40
        if mode == "jpeg":
            assert result["reencoded"] == {"resized (--max-side)": 24}


def test_output_does_not_depend_on_workers(image_folder, tmp_path):
    prints = []
    for workers in (0, 1, 2):
        dst = tmp_path / f"w{workers}"
        convert(image_folder, dst, shard_size="100KB", workers=workers, progress=False)
        prints.append(dataset_fingerprint(dst))
    assert prints[0] == prints[1] == prints[2]


def test_seed_changes_order_not_content(image_folder, tmp_path):
    convert(image_folder, tmp_path / "a", seed=1, **FAST)
    convert(image_folder, tmp_path / "b", seed=2, **FAST)
    a, b = Dataset(tmp_path / "a"), Dataset(tmp_path / "b")
    order_a = [record_detail(tmp_path / "a", i)["source"] for i in range(len(a))]
    order_b = [record_detail(tmp_path / "b", i)["source"] for i in range(len(b))]
    assert order_a != order_b and sorted(order_a) == sorted(order_b)


def test_labels_from_csv_list_with_names(image_folder, tmp_path):
    rows = ["path,label"] + [f"class_0{c}/{p.name},{'cat' if c else 'dog'}"
                             for c in range(3) for p in sorted((image_folder / f"class_0{c}").iterdir())]
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    convert(image_folder, tmp_path / "ds", list_file=tmp_path / "list.csv", **FAST)
    ds = Dataset(tmp_path / "ds")
    assert ds.classes == ["cat", "dog"]
    assert ds.manifest["class_counts"] == [16, 8]


def test_labels_from_tsv_list_with_integers(image_folder, tmp_path):
    files = sorted(p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*.jpg"))
    (tmp_path / "list.tsv").write_text("".join(f"{f}\t{i % 5}\n" for i, f in enumerate(files)))
    convert(image_folder, tmp_path / "ds", list_file=tmp_path / "list.tsv", shuffle=False, **FAST)
    ds = Dataset(tmp_path / "ds")
    assert ds.classes == ["0", "1", "2", "3", "4"]
    assert [ds[i][1] for i in range(len(ds))] == [i % 5 for i in range(len(files))]


def test_list_paths_may_not_escape_src(image_folder, tmp_path):
    (tmp_path / "list.csv").write_text("../etc/passwd,1\n")
    with pytest.raises(ValueError, match="inside"):
        convert(image_folder, tmp_path / "ds", list_file=tmp_path / "list.csv", **FAST)


def test_odd_inputs_keep_their_bytes_or_are_rejected(odd_folder, tmp_path):
    """Grayscale, CMYK, progressive and EXIF-rotated JPEGs keep their original bytes and
    decode to exactly Pillow's upright RGB; a PNG named .jpg is identified by its content
    and stored losslessly (its own file when smaller than its pixels, else raw pixels);
    broken files are rejected with the reason."""
    from PIL import ImageOps

    root, files = odd_folder
    result = convert(root, tmp_path / "ds", jpeg_restarts=False, **FAST)
    ds = Dataset(tmp_path / "ds")
    assert len(ds) == 6 and result["rejects"] == 3
    assert result["reencoded"] == {}
    png = (root / files["png_named_jpg"]).read_bytes()
    with Image.open(io.BytesIO(png)) as img:
        kept = len(png) < 3 * img.width * img.height
    assert result["lossless"] == ({} if kept else {"PNG image stored as raw pixels": 1})
    assert ds.manifest["lossless"] == result["lossless"]
    reasons = {r["path"]: r["reason"] for r in ds.manifest["rejects"]}
    assert set(reasons) == {files["truncated"], files["zero_bytes"], files["not_an_image"]}
    assert "truncated" in reasons[files["truncated"]]
    assert "empty" in reasons[files["zero_bytes"]]
    rejects_tsv = (tmp_path / "ds" / "rejects.tsv").read_text().splitlines()
    assert rejects_tsv[0] == "path\treason" and len(rejects_tsv) == 4
    for i in range(len(ds)):
        rel = record_detail(tmp_path / "ds", i)["source"]
        original = (root / rel).read_bytes()
        expected = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(original)))
                              .convert("RGB"))
        pixels, _ = ds[i]
        np.testing.assert_array_equal(pixels, expected, err_msg=rel)
        payload, entry = ds.record(i)
        if rel == files["png_named_jpg"]:
            assert entry["kind"] == (fmt.KIND_FILE if kept else fmt.KIND_RAW)
            assert not kept or bytes(payload) == png
        else:
            assert bytes(payload) == original, rel
    by_source = {record_detail(tmp_path / "ds", i)["source"]: ds.record(i)[1] for i in range(6)}
    assert (int(by_source[files["exif_rotated"]]["orientation"]),
            int(by_source[files["exif_rotated"]]["height"])) == (6, 40)
    assert int(by_source[files["gray"]]["colour"]) == fmt.COLOUR_GRAY
    assert int(by_source[files["cmyk"]]["colour"]) == fmt.COLOUR_CMYK


def test_odd_inputs_raw_mode_are_upright_rgb(odd_folder, tmp_path):
    root, files = odd_folder
    convert(root, tmp_path / "ds", mode="raw", **FAST)
    ds = Dataset(tmp_path / "ds")
    shapes = sorted(ds[i][0].shape for i in range(len(ds)))
    assert shapes == [(30, 40, 3)] * 5 + [(40, 30, 3)]


def test_on_error_fail_names_the_file(odd_folder, tmp_path):
    root, _ = odd_folder
    with pytest.raises(ConversionError, match=r"c/\w+\.JPG"):
        convert(root, tmp_path / "ds", on_error="fail", shuffle=False, **FAST)
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_non_empty_dst_is_an_error(image_folder, tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "notes.txt").write_text("mine")
    with pytest.raises(ConversionError, match="not empty"):
        convert(image_folder, tmp_path / "ds", **FAST)
    convert(image_folder, tmp_path / "ds", overwrite=True, **FAST)
    assert (tmp_path / "ds" / "notes.txt").read_text() == "mine"  # never ours to delete
    assert len(Dataset(tmp_path / "ds")) == 24


def test_resume_of_a_complete_dataset_does_nothing(image_folder, tmp_path):
    convert(image_folder, tmp_path / "ds", **FAST)
    before = dataset_fingerprint(tmp_path / "ds")
    assert convert(image_folder, tmp_path / "ds", resume=True, **FAST)["already_complete"]
    assert dataset_fingerprint(tmp_path / "ds") == before


def test_resume_with_changed_options_is_refused(image_folder, tmp_path):
    from dlpack_io.packer import journal

    dst = tmp_path / "ds"
    dst.mkdir()
    journal.Journal(dst, {"plan": "something else", "num_inputs": 1})
    with pytest.raises(ConversionError, match=r"cannot resume: the source files or packing "
                                              r"options \(the interrupted run's journal does not "
                                              r"record which\)"):
        convert(image_folder, dst, resume=True, **FAST)


def test_concurrent_convert_into_one_dst_is_refused(image_folder, tmp_path):
    dst = tmp_path / "ds"
    dst.mkdir()
    lock = DstLock(str(dst))
    lock.acquire()
    try:
        with pytest.raises(RuntimeError, match="another dlpack convert"):
            convert(image_folder, dst, resume=True, **FAST)
    finally:
        lock.release()
    convert(image_folder, dst, resume=True, **FAST)
    assert len(Dataset(dst)) == 24


def test_no_usable_input_is_an_error(tmp_path):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.jpg").write_bytes(b"")
    with pytest.raises(ConversionError, match="none of the 1 inputs"):
        convert(tmp_path / "src", tmp_path / "ds", **FAST)


def test_empty_source_is_an_error(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(ValueError, match=r"no image files \(\.jpg, .*found in class sub-folders"):
        convert(tmp_path / "src", tmp_path / "ds", **FAST)


def test_shards_respect_shard_size(image_folder, tmp_path):
    convert(image_folder, tmp_path / "ds", shard_size="20KB", **FAST)
    ds = Dataset(tmp_path / "ds")
    for shard in ds.shards:
        lengths = shard.index["length"]
        assert len(lengths) == 1 or sum(((n + 63) // 64) * 64 for n in lengths) <= 20_000


def test_packer_convert_stays_the_function_after_the_module_is_imported():
    import dlpack_io.packer
    import dlpack_io.packer.conversion  # noqa: F401  (importing it must not shadow the function)

    assert callable(dlpack_io.packer.convert) and not hasattr(dlpack_io.packer.convert, "__path__")
    from dlpack_io.packer import convert as again

    assert again is dlpack_io.packer.conversion.convert  # the real one, its signature shown


@pytest.mark.parametrize("existed", [False, True])
def test_an_engine_that_cannot_start_leaves_dst_as_it_was(image_folder, tmp_path, monkeypatch,
                                                          existed):
    """The engine starts (Ray connects) after DST is created and locked: when it cannot,
    a folder this run created goes, and a folder that was there stays, without our lock."""
    import contextlib

    from dlpack_io.packer import conversion

    @contextlib.contextmanager
    def cannot_connect(*args):
        raise ConversionError("cannot connect to the Ray cluster at 127.0.0.2:1")
        yield

    monkeypatch.setattr(conversion, "engine_context", cannot_connect)
    dst = tmp_path / "ds"
    if existed:
        dst.mkdir()
    with pytest.raises(ConversionError, match="cannot connect to the Ray cluster"):
        convert(image_folder, dst, progress=False)
    assert dst.exists() == existed
    if existed:
        assert os.listdir(dst) == []
