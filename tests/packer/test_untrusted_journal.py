"""A conversion journal that was damaged or edited (issue 26, kind 3): --resume keeps only
lines whose checksum passes and whose counts add up, redoes the rest, and the result is the
same data set an uninterrupted run writes; a manifest that does not account for every input
is never written, and verify reports one."""
from __future__ import annotations

import json
import logging

import pytest

from dlpack_io.packer import convert, journal
from dlpack_io.packer.finalize import atomic_write
from dlpack_io.reader import format as fmt
from dlpack_io.tools.verification import verify

from helpers import convert_stopped_at, dataset_fingerprint, gone, wait_until

OPTIONS = ["--shard-size", "30KB", "--workers", "1", "--quiet", "--no-shuffle"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    from dlpack_io.tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("journal_src")
    make_image_folder(root, 60, 3, seed=4, size=(48, 64))
    (root / "class_00" / "0000_broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    return root


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    dst = tmp_path_factory.mktemp("journal_ref") / "ds"
    convert(source, dst, shard_size="30KB", workers=1, shuffle=False, progress=False)
    return dataset_fingerprint(dst)


@pytest.fixture
def interrupted(source, tmp_path):
    """DST of a conversion SIGKILLed right after its 5th shard was journaled."""
    dst = tmp_path / "ds"
    children = convert_stopped_at("journal:5", [source, dst, *OPTIONS])
    # its workers hold the DST lock until they notice the parent is gone
    wait_until(lambda: all(gone(pid) for pid in children), what="the killed run's workers")
    plan, done = journal.read_journal(dst)
    assert plan is not None and len(done) == 5
    assert done[0]["rejects"] == [["class_00/0000_broken.jpg", done[0]["rejects"][0][1]]]
    return dst


def _lines(dst):
    return [json.loads(line) for line in (dst / journal.JOURNAL_NAME).read_text().splitlines()]


def _write(dst, lines, *, reseal=True):
    text = "".join(json.dumps(journal.seal(e) if reseal else e, sort_keys=True) + "\n"
                   for e in lines)
    (dst / journal.JOURNAL_NAME).write_text(text)


def _resume(source, dst):
    return convert(source, dst, resume=True, shard_size="30KB", workers=1, shuffle=False,
                   progress=False)


def test_an_honest_journal_is_kept_whole(source, reference, interrupted):
    plan, done = journal.read_journal(interrupted)
    assert journal.accounted(done, plan, 3, "x") == done
    summary = _resume(source, interrupted)
    assert summary["resumed_from"] == done[-1]["end_input"] and summary["rejects"] == 1
    assert dataset_fingerprint(interrupted) == reference


def _edit_end(lines):
    lines[3]["end_input"] += 4      # claims 4 more inputs done: they would be lost


def _drop_line(lines):
    del lines[2]                     # a shard line gone: the next does not follow on


def _drop_reject(lines):
    lines[1]["rejects"] = []         # the rejected input vanishes from the record
    lines[1]["end_input"] -= 1       # ... and the counts are made to look consistent


def _counts(lines):
    lines[2]["class_counts"][0] += 1


@pytest.mark.parametrize("edit", [_edit_end, _drop_line, _drop_reject, _counts])
@pytest.mark.parametrize("reseal", [False, True], ids=["crc-broken", "crc-recomputed"])
def test_an_edited_journal_is_redone_from_the_first_bad_line(source, reference, interrupted,
                                                             edit, reseal, caplog):
    lines = _lines(interrupted)
    edit(lines)
    _write(interrupted, lines, reseal=reseal)
    with caplog.at_level(logging.WARNING):
        summary = _resume(source, interrupted)
    # each line is sealed on its own: a removed line leaves the others' checksums intact
    expected = "fails its checksum" if not reseal and edit is not _drop_line \
        else "does not add up"
    assert expected in caplog.text
    assert summary["resumed_from"] < _lines_end(lines)
    assert summary["rejects"] == 1
    assert dataset_fingerprint(interrupted) == reference  # nothing lost, nothing twice


def _lines_end(lines):
    return lines[-1]["end_input"]


def test_a_journal_without_checksums_is_not_trusted(source, reference, interrupted):
    lines = [journal.unseal(e) for e in _lines(interrupted)]
    _write(interrupted, lines, reseal=False)
    assert journal.read_journal(interrupted) == (None, [])
    summary = _resume(source, interrupted)
    assert summary["resumed_from"] == 0 and dataset_fingerprint(interrupted) == reference


def test_verify_reports_a_manifest_that_loses_an_input(source, tmp_path):
    dst = tmp_path / "ds"
    convert(source, dst, shard_size="30KB", workers=1, shuffle=False, progress=False)
    assert verify(str(dst), progress=False).ok
    manifest = json.loads((dst / fmt.MANIFEST_NAME).read_text())
    assert manifest["source"]["num_inputs"] == manifest["num_samples"] + 1
    manifest["rejects"] = []
    manifest["checksum"] = fmt.manifest_checksum(manifest)
    atomic_write(dst / fmt.MANIFEST_NAME, fmt.encode_meta(manifest))
    report = verify(str(dst), progress=False)
    assert [p["problem"] for p in report.problems] == [
        f"accounting: source.num_inputs is {manifest['num_samples'] + 1}, but "
        f"{manifest['num_samples']} samples packed + 0 rejects = {manifest['num_samples']}: "
        f"1 input(s) unaccounted for; convert the source again"]


def test_line_problems_are_named():
    entry = {"shard": {"num_samples": 3, "first_sample": 0}, "end_input": 4,
             "rejects": [["a.jpg", "bad"]], "class_counts": [2, 1]}
    assert journal.line_problem(entry, 0, 0, 10, 2) is None
    assert journal.line_problem(entry, 0, 0, 3, 2) == "end_input 4 outside (0, 3]"
    assert journal.line_problem(entry, 0, 5, 10, 2) == "first_sample 0, expected 5"
    assert journal.line_problem(dict(entry, end_input=5), 0, 0, 10, 2) == \
        "inputs 0-4 (5) != 3 samples + 1 rejects"
    assert journal.line_problem(dict(entry, end_input="4"), 0, 0, 10, 2).startswith(
        "malformed (ValueError: end_input is '4'")
    assert journal.line_problem(dict(entry, rejects=[["a.jpg"]]), 0, 0, 10, 2) == \
        "rejects is not a list of (path, reason) pairs"


def test_a_consistent_lie_in_a_bucket_journal_is_redone(s3_env, source, caplog, monkeypatch):
    """The same proof for an s3:// DST: the kept shard's own paths are read by range."""
    from dlpack_io.packer import upload
    from dlpack_io.packer.records import ConversionError
    from dlpack_io.reader.remote.storage import Store

    url, real, calls = "s3://dlpack-test/untrusted/journal", upload.upload_shard, []

    def failing(store, staging, entry):
        calls.append(entry["name"])
        if len(calls) == 4:
            raise OSError("network went away (injected)")
        real(store, staging, entry)
    monkeypatch.setattr(upload, "upload_shard", failing)
    kw = dict(shard_size="30KB", workers=1, shuffle=False, progress=False)
    with pytest.raises(ConversionError, match="upload failed"):
        convert(source, url, **kw)
    monkeypatch.setattr(upload, "upload_shard", real)
    store = Store(url)
    lines = [json.loads(x) for x in store.get(journal.JOURNAL_NAME).decode().splitlines()]
    assert len(lines) == 4 and lines[1]["rejects"]  # plan + 3 shards; shard 0 has the reject
    _drop_reject(lines)
    store.put(journal.JOURNAL_NAME, "".join(journal.journal_line(journal.unseal(e))
                                            for e in lines).encode())
    with caplog.at_level(logging.WARNING):
        result = convert(source, url, resume=True, **kw)
    assert "disagrees with the shard" in caplog.text and result["resumed_from"] == 0
    manifest = json.loads(store.get(fmt.MANIFEST_NAME))
    assert len(manifest["rejects"]) == 1 and fmt.accounting_problem(manifest) is None
