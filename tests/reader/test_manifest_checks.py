"""Every check of the manifest (format.validate_manifest, manifest.load_manifest), each
reached with the manifest's own checksum resealed, each expecting its own message.

The manifest is a real one (a small packed data set); each case changes one thing the way
a hand edit or a hostile file would, recomputes the checksum and writes it back, so only
the check under test can object. Cases run through ``load_manifest`` (what Dataset,
inspect and verify call) unless they need a value JSON cannot carry.
"""
import json
import os
import re

import pytest

from dlpack_io.reader import Dataset
from dlpack_io.reader import format as fmt
from dlpack_io.reader.dataset import NotADatasetError, load_manifest
from dlpack_io.tools.verification import verify


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("manifests")
    make_image_folder(root / "src", 12, 3, seed=6, size=(24, 32))
    convert(root / "src", root / "ds", mode="raw", size=8, shard_size="1KB", workers=1,
            progress=False)
    return root / "ds"


@pytest.fixture
def manifest(packed):
    """A fresh copy of the intact manifest (a dict)."""
    return json.loads((packed / fmt.MANIFEST_NAME).read_text())


def _write(tmp_path, manifest: dict, reseal: bool = True):
    ds = tmp_path / "ds"
    ds.mkdir(exist_ok=True)
    if reseal:
        manifest["checksum"] = fmt.manifest_checksum(manifest)
    (ds / fmt.MANIFEST_NAME).write_bytes(fmt.encode_meta(manifest))
    return ds


def _refused(tmp_path, manifest, match, reseal=True):
    """load_manifest refuses it naming the file; Dataset and verify say the same."""
    ds = _write(tmp_path, manifest, reseal)
    where = re.escape(str(ds / fmt.MANIFEST_NAME))
    with pytest.raises(fmt.FormatError, match=f"^{where}: {match}"):
        load_manifest(ds)
    with pytest.raises(fmt.FormatError, match=match):
        Dataset(ds)
    report = verify(ds, progress=False)
    assert not report.ok and not report.not_a_dataset
    assert re.search(match, report.problems[0]["problem"]), report.problems


def test_intact_manifest_loads(packed, manifest, tmp_path):
    assert load_manifest(packed)["num_samples"] == 12
    ds = _write(tmp_path, manifest)  # resealing an unchanged manifest changes nothing
    assert load_manifest(ds) == json.loads((packed / fmt.MANIFEST_NAME).read_text())


@pytest.mark.parametrize("key", sorted(fmt.MANIFEST_FIELDS))
def test_every_required_field(manifest, tmp_path, key):
    if key == "checksum":
        del manifest["checksum"]
        return _refused(tmp_path, manifest, "missing required field 'checksum'", reseal=False)
    del manifest[key]
    _refused(tmp_path, manifest, f"missing required field '{key}'")


@pytest.mark.parametrize("key,value,shown", [
    ("num_samples", "12", "str '12', expected int"),
    ("num_samples", True, "bool True, expected int"),
    ("classes", {"a": 1}, "dict {'a': 1}, expected list"),
    ("options", [], "list \\[\\], expected dict"),
    ("kind", 7, "int 7, expected str"),
])
def test_field_types(manifest, tmp_path, key, value, shown):
    manifest[key] = value
    _refused(tmp_path, manifest, f"field '{key}' is {shown}")


@pytest.mark.parametrize("value,word", [(-1, "negative"), (2**63, "too large")])
def test_integer_ranges(manifest, tmp_path, value, word):
    manifest["num_bytes"] = value
    _refused(tmp_path, manifest, rf"field 'num_bytes' is {word} \({value}\), expected "
                                 rf"0..9223372036854775807")


def test_kind(manifest, tmp_path):
    manifest["kind"] = "dlpack-other"
    _refused(tmp_path, manifest, "kind is 'dlpack-other', expected 'dlpack-dataset'")


@pytest.mark.parametrize("version,match", [
    (1, r"format version 1, this dlpack reads versions \(2, 3, 4\) .*re-pack it with this dlpack"),
    (5, r"format version 5, this dlpack reads versions \(2, 3, 4\); upgrade dlpack \(pip install -U "
        r"dlpack-io\)"),
    (4, r"version 4 without a 'retired' list: only a version-4 manifest retires records"),
])
def test_version(manifest, tmp_path, version, match):
    manifest["version"] = version
    _refused(tmp_path, manifest, match)


def test_checksum_mismatch(manifest, tmp_path):
    manifest["class_counts"][0] += 1
    manifest["class_counts"][1] -= 1  # every other check still holds
    _refused(tmp_path, manifest, r"manifest checksum mismatch \(stored 0x[0-9a-f]+, computed "
                                 r"0x[0-9a-f]+\): the manifest was edited or damaged",
             reseal=False)


@pytest.mark.parametrize("value", [{"deep": 10**5000}, "deep"])
def test_checksum_that_cannot_be_recomputed(manifest, value):
    """A manifest dict that JSON cannot re-encode (a huge int, or nesting past the
    recursion limit): a FormatError, not a ValueError/RecursionError."""
    if value == "deep":
        value = nested = {}
        for _ in range(100_000):
            nested["x"] = {}
            nested = nested["x"]
    manifest["options"] = value
    with pytest.raises(fmt.FormatError, match=r"m.json: cannot re-encode the manifest to check "
                                              r"its checksum \((ValueError|RecursionError)\): "
                                              r"nested too deeply or damaged"):
        fmt.validate_manifest(manifest, "m.json")


@pytest.mark.parametrize("key,value", [("format", "zip"), ("mode", "png")])
def test_format_and_mode(manifest, tmp_path, key, value):
    manifest[key] = value
    fmt_, mode = manifest["format"], manifest["mode"]
    _refused(tmp_path, manifest, f"format '{fmt_}' / mode '{mode}': expected format record or "
                                 f"lmdb and mode jpeg or raw")


def test_shard_entry_must_be_an_object(manifest, tmp_path):
    manifest["shards"][1] = ["shard-00001.rec"]
    _refused(tmp_path, manifest, r"shards\[1\]: expected an object")


@pytest.mark.parametrize("key", sorted(fmt.SHARD_ENTRY_FIELDS))
def test_shard_entry_fields(manifest, tmp_path, key):
    del manifest["shards"][1][key]
    _refused(tmp_path, manifest, rf"shards\[1\]: missing required field '{key}'")


def test_shard_crc_is_32_bits(manifest, tmp_path):
    manifest["shards"][1]["crc"] = 2**32
    _refused(tmp_path, manifest, r"shards\[1\]: crc 4294967296 is not a 32-bit checksum")


@pytest.mark.parametrize("name", ["../shard-00001.rec", "shard-1.rec", "/etc/passwd",
                                  "sub/shard-00001.rec", "shard-00001.rec/.."])
def test_shard_names_cannot_leave_the_folder(manifest, tmp_path, name):
    manifest["shards"][1]["name"] = name
    _refused(tmp_path, manifest, rf"shards\[1\]: shard name {re.escape(repr(name))} is not of the "
                                 rf"form 'shard-NNNNN.rec' or 'shard-NNNNN.lmdb' \(no directories")


def test_shard_name_type_is_checked_before_the_pattern():
    with pytest.raises(fmt.FormatError, match="m: shard name 7 is not of the form"):
        fmt.check_shard_name(7, "m")


def test_shard_suffix_must_match_the_format(manifest, tmp_path):
    """The issue's survivor: an LMDB-named shard in a record data set was accepted."""
    manifest["shards"][1]["name"] = "shard-00001.lmdb"
    _refused(tmp_path, manifest, r"shards\[1\]: 'shard-00001.lmdb' is not a record shard")


def test_shards_must_tile_the_samples(manifest, tmp_path):
    manifest["shards"][1]["first_sample"] += 1
    first = manifest["shards"][1]["first_sample"]
    _refused(tmp_path, manifest, rf"shards\[1\]: first_sample {first}, expected {first - 1} "
                                 rf"\(shards must tile the sample range\)")


def test_total_samples(manifest, tmp_path):
    manifest["num_samples"] += 1
    manifest["class_counts"][0] += 1
    _refused(tmp_path, manifest, "shards hold 12 samples, num_samples says 13")


@pytest.mark.parametrize("key,value,shown", [
    ("classes", ["a", 7, "c"], r"classes\[1\] is int 7, expected a string"),
    ("class_counts", [4, "4", 4], r"class_counts\[1\] is str '4', expected a count"),
    ("class_counts", [4, -4, 12], r"class_counts\[1\] is int -4, expected a count"),
    ("class_counts", [4, True, 7], r"class_counts\[1\] is bool True, expected a count"),
])
def test_class_lists(manifest, tmp_path, key, value, shown):
    manifest[key] = value
    _refused(tmp_path, manifest, shown)


def test_classes_and_counts_differ_in_length(manifest, tmp_path):
    """The issue's survivor: a manifest whose classes and counts differ in length."""
    manifest["classes"].append("extra")
    _refused(tmp_path, manifest, "4 classes but 3 class counts; expected one count per class")


def test_a_class_without_samples_is_fine(manifest, tmp_path):
    """An empty class folder gives a class with count 0 (warned about when packing)."""
    manifest["classes"].append("empty")
    manifest["class_counts"].append(0)
    assert load_manifest(_write(tmp_path, manifest))["class_counts"][-1] == 0


def test_class_counts_must_add_up(manifest, tmp_path):
    manifest["class_counts"][0] += 1
    _refused(tmp_path, manifest, "class counts add up to 13, num_samples says 12")


@pytest.mark.parametrize("source", [{"root": 7}, {"list": ["x"]}, {"num_inputs": "12"}])
def test_source(manifest, tmp_path, source):
    manifest["source"].update(source)
    _refused(tmp_path, manifest, r"source must hold root and list \(text or null\) and "
                                 r"num_inputs \(a count\)")


@pytest.mark.parametrize("reject", ["x", {"path": "a.jpg"}, {"path": 1, "reason": "r"}])
def test_rejects(manifest, tmp_path, reject):
    manifest["rejects"] = [{"path": "ok.jpg", "reason": "fine"}, reject]
    _refused(tmp_path, manifest, r"rejects\[1\] is not a \{path, reason\} pair of texts")


def test_reencoded_counts(manifest, tmp_path):
    manifest["reencoded"] = {"cmyk": 1, "png": "2"}
    _refused(tmp_path, manifest, r"reencoded\[1\] is str '2', expected a count")


def test_shard_listed_twice(manifest, tmp_path):
    second = manifest["shards"][1]
    second["name"] = manifest["shards"][0]["name"]
    _refused(tmp_path, manifest, "a shard file is listed twice; each must appear once")


# ---- the bytes of the file (decode_json, read_limited) ---------------------------------------
@pytest.mark.parametrize("text,match", [
    (b"{not json", r"not valid UTF-8 JSON \(Expecting property name"),
    (b'{"a": "\xff"}', r"not valid UTF-8 JSON \('utf-8' codec can't decode byte 0xff"),
    (b"[1, 2]", "expected a JSON object, found list"),
    (b"[" * 100_000, "JSON nested too deeply to parse: not a dlpack file"),
])
def test_manifest_bytes(tmp_path, text, match):
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / fmt.MANIFEST_NAME).write_bytes(text)
    with pytest.raises(fmt.FormatError, match=match):
        load_manifest(ds)


def test_manifest_larger_than_the_limit(tmp_path, monkeypatch):
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / fmt.MANIFEST_NAME).write_bytes(b" " * 2000)
    monkeypatch.setattr(fmt, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(fmt.FormatError, match=r"manifest.json: 2000 bytes, more than the "
                                              r"1000-byte limit for this file: not a dlpack file"):
        load_manifest(ds)


def test_manifest_size_limit_is_256_mib(manifest, tmp_path):
    """The documented limit (docs/FORMAT.md, "Limits"): one byte more is refused before a
    byte is read (a sparse file: nothing is written), a 1 MB manifest is fine."""
    ds = tmp_path / "ds"
    ds.mkdir()
    with open(ds / fmt.MANIFEST_NAME, "wb") as f:
        f.truncate(256 * 2**20 + 1)
    with pytest.raises(fmt.FormatError, match=r"manifest.json: 268435457 bytes, more than the "
                                              r"268435456-byte limit for this file"):
        load_manifest(ds)
    manifest["source"]["root"] = "x" * 2**20  # a long path list, say
    big = _write(tmp_path, manifest)
    assert len((big / fmt.MANIFEST_NAME).read_bytes()) > 2**20
    assert load_manifest(big)["source"]["root"] == "x" * 2**20


# ---- a folder that is not a data set (manifest.load_manifest) ---------------------------------
def test_no_such_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nope'}: no such data set folder"):
        load_manifest(tmp_path / "nope")


@pytest.mark.parametrize("names,why", [
    ([".dlpack-convert.journal"], "a conversion into it is still running or was interrupted; "
                                  "finish it with 'dlpack convert SRC {ds} --resume'"),
    ([".shard-00000.rec.partial"], "a conversion into it is still running or was interrupted"),
    (["shard-00000.rec"], "it holds shard files but no manifest: an interrupted conversion "
                          "\\(finish it with 'dlpack convert SRC {ds} --resume'\\) or an "
                          "incomplete copy \\(copy manifest.json too\\)"),
    (["cat.JPG"], "it looks like a folder of images: pack it with 'dlpack convert {ds} DST'"),
    (["dogs/a.jpeg"], "it looks like a folder of images"),
    (["notes.txt"], "point at the folder that 'dlpack convert' wrote \\(it holds manifest.json "
                    "and shard files\\)"),
])
def test_not_a_data_set_says_what_the_folder_looks_like(tmp_path, names, why):
    ds = tmp_path / "folder"
    for name in names:
        (ds / name).parent.mkdir(parents=True, exist_ok=True)
        (ds / name).write_bytes(b"x")
    match = f"{ds} is not a dlpack data set \\(no manifest.json\\): " + why.format(ds=ds)
    with pytest.raises(NotADatasetError, match=match):
        load_manifest(ds)
    report = verify(ds, progress=False)
    assert report.not_a_dataset and report.exit_code == 3
    assert re.search(match, report.problems[0]["problem"])


def test_verify_of_a_damaged_manifest_is_damaged_not_missing(manifest, tmp_path):
    manifest["kind"] = "x"
    ds = _write(tmp_path, manifest)
    report = verify(ds, progress=False)
    assert report.exit_code == 1 and not report.not_a_dataset
    assert report.problems[0]["where"] == os.path.join(ds, fmt.MANIFEST_NAME)


def test_json_depth_counts_brackets_outside_strings_only():
    """The depth check runs before the parser (which, with a raised recursion limit, would
    overflow the C stack on hostile nesting): brackets inside strings, escaped quotes
    included, do not count; 32 levels parse, 33 are refused naming the depth."""
    inside = '"' + '[[[[{{{{\\"[[[[' * 20 + '"'
    assert fmt.json_depth(('{"a": ' + inside + ', "b": [[1]]}').encode()) == 3
    assert fmt.decode_json(('{"p": ' + inside + '}').encode(), "m")["p"].startswith("[[[[{{{{")
    nested = lambda n: ('{"a": ' + "[" * (n - 1) + "]" * (n - 1) + "}").encode()  # noqa: E731
    assert fmt.decode_json(nested(32), "m") == {"a": eval("[" * 31 + "]" * 31)}
    with pytest.raises(fmt.FormatError, match=r"m: JSON nested too deeply to parse: not a "
                                              r"dlpack file \(33 levels, at most 32\)"):
        fmt.decode_json(nested(33), "m")
