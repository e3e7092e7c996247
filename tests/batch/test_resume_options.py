"""--resume only continues the conversion that was interrupted.

The journal's first line holds the plan: a hash of the options and inputs, and next to it
the options themselves, so a resume with other options or other source files is refused
naming what differs (and touches nothing). A valid resume keeps the finished shards' files
as they are (same inode, same mtime) and gives the bytes of an uninterrupted run; a
finished shard damaged since (size or checksum) is redone, with everything after it.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from dlpack_io.packer import convert, journal
from dlpack_io.packer.records import ConversionError
from dlpack_io.tools.verification import verify

from helpers import convert_stopped_at, dataset_fingerprint

CLI = ["--shard-size", "20KB", "--workers", "1", "--quiet"]
API = dict(shard_size="20KB", workers=1, progress=False)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    from dlpack_io.tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("resume_opts_src")
    make_image_folder(root, 60, 3, seed=12, size=(48, 64))
    return root


@pytest.fixture(scope="module")
def interrupted(source, tmp_path_factory):
    """{format: a DST whose conversion was SIGKILLed after its 3rd shard was journaled}."""
    out = {}
    for data_format in ("record", "lmdb"):
        dst = tmp_path_factory.mktemp("interrupted") / data_format
        convert_stopped_at("journal:3", [source, dst, *CLI, "--format", data_format])
        out[data_format] = dst
    return out


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    out = {}
    for data_format in ("record", "lmdb"):
        dst = tmp_path_factory.mktemp("reference") / data_format
        convert(source, dst, format=data_format, **API)
        out[data_format] = dataset_fingerprint(dst)
    return out


@pytest.fixture
def dst(interrupted, tmp_path):
    """A private copy of the interrupted record conversion (metadata preserved)."""
    copy = tmp_path / "ds"
    shutil.copytree(interrupted["record"], copy)
    return copy


def _files(dst) -> dict:
    """name -> (inode, mtime_ns, size, bytes) of every file in DST but the lock (which a
    run removes when it ends, whatever the outcome)."""
    out = {}
    for name in sorted(os.listdir(dst)):
        if name == journal.LOCK_NAME:
            continue
        st = os.stat(dst / name)
        out[name] = (st.st_ino, st.st_mtime_ns, st.st_size, (dst / name).read_bytes())
    return out


def _journaled(dst) -> list:
    return [e["shard"]["name"] for e in journal.read_journal(dst)[1]]


def test_the_interrupted_runs_are_what_the_tests_need(interrupted):
    for data_format, dst in interrupted.items():
        assert not (dst / "manifest.json").exists()
        suffix = ".rec" if data_format == "record" else ".lmdb"
        assert _journaled(dst) == [f"shard-0000{k}{suffix}" for k in range(3)]
        plan = journal.read_journal(dst)[0]
        assert plan["options"]["format"] == data_format and plan["num_inputs"] == 60


# option changed at resume -> the differences the refusal must name
CHANGES = {
    "shard_size": (dict(shard_size="30KB"), ["shard_size: 20000 then, 30000 now"]),
    "quality": (dict(quality=80), ["quality: 95 then, 80 now"]),
    "format": (dict(format="lmdb"), ["format: 'record' then, 'lmdb' now"]),
    "seed": (dict(seed=1), ["seed: 0 then, 1 now"]),
    "shuffle": (dict(shuffle=False), ["shuffle: True then, False now"]),
    "max_side": (dict(max_side=32), ["max_side: None then, 32 now"]),
    "max_pixels": (dict(max_pixels=10**6), ["max_pixels: 89478485 then, 1000000 now"]),
    "mode": (dict(mode="raw", size=16), ["mode: 'jpeg' then, 'raw' now",
                                         "size: None then, 16 now"]),
}


@pytest.mark.parametrize("option", sorted(CHANGES))
def test_resume_with_other_options_is_refused_naming_them(source, dst, option):
    changes, named = CHANGES[option]
    before = _files(dst)
    kw = dict(API, **changes)
    with pytest.raises(ConversionError, match=f"^{dst}: cannot resume: ") as info:
        convert(source, dst, resume=True, **kw)
    message = str(info.value)
    for difference in named:
        assert difference in message, message
    assert "run it with the same options and source files, or use --overwrite" in message
    unchanged = [k for k in ("shard_size", "quality", "format", "seed") if k not in changes]
    assert not any(f"{k}:" in message for k in unchanged), message  # only what differs
    assert _files(dst) == before  # the refusal touched nothing


def test_resume_with_another_source_file_is_refused(source, dst, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(source, src, copy_function=shutil.copy2)  # same sizes and mtimes
    # the copy is another root but the plan holds relative paths: it resumes as is ...
    assert journal.plan_differences(journal.read_journal(dst)[0],
                                    _plan_of(src)) == []
    shutil.copy2(src / "class_00" / os.listdir(src / "class_00")[0], src / "class_00" / "new.jpg")
    with pytest.raises(ConversionError, match=r"cannot resume: the source files \(60 inputs "
                                              r"then, 61 now\)"):
        convert(src, dst, resume=True, **API)
    os.unlink(src / "class_00" / "new.jpg")
    first = src / "class_01" / sorted(os.listdir(src / "class_01"))[0]
    os.utime(first, ns=(0, 10**9))
    with pytest.raises(ConversionError, match=r"cannot resume: the source files \(60 inputs, "
                                              r"but a file was renamed, relabelled or modified\)"):
        convert(src, dst, resume=True, **API)


def _plan_of(src):
    from dlpack_io.packer.packing import plan_inputs, prepare_inputs

    opts, inputs = prepare_inputs(src, None, dict(API))
    return plan_inputs(inputs, opts)[1]


def test_a_journal_without_options_still_refuses(source, dst):
    """A journal written before the options were recorded (plan hash only)."""
    plan, shards = journal.read_journal(dst)
    journal.Journal(dst, {"plan": "0" * 64, "num_inputs": 60}, shards)
    with pytest.raises(ConversionError, match=r"cannot resume: the source files or packing "
                                              r"options \(the interrupted run's journal does not "
                                              r"record which\)"):
        convert(source, dst, resume=True, **API)


def test_cli_prints_the_refusal(source, dst):
    done = subprocess.run([sys.executable, "-m", "dlpack_io.tools.cli", "convert", str(source),
                           str(dst), *CLI, "--quality", "70", "--resume"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "cannot resume: quality: 95 then, 70 now" in done.stderr


@pytest.mark.parametrize("data_format", ["record", "lmdb"])
def test_valid_resume_keeps_finished_shards_untouched(source, interrupted, reference, tmp_path,
                                                      data_format):
    dst = tmp_path / "ds"
    shutil.copytree(interrupted[data_format], dst)  # copy2: mtimes preserved
    kept = _journaled(dst)
    before = {name: stat for name, stat in _files(dst).items() if name in kept}
    result = convert(source, dst, resume=True, format=data_format, **API)
    assert result["resumed_from"] > 0
    after = _files(dst)
    for name in kept:
        assert after[name] == before[name], f"{name} was rewritten"
    assert dataset_fingerprint(dst) == reference[data_format]


def _damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "header-byte":  # record shards: covered by the header CRC
        data[20] ^= 1
    elif how == "lmdb-metadata":  # a byte of the metadata value (its CRC is in the journal)
        at = data.find(b'"first_sample"')
        assert at > 0
        data[at + 2] ^= 0x20
    elif how == "truncated":
        del data[len(data) // 2:]
    elif how == "appended":
        data += b"\0" * 10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("data_format,how", [("record", "header-byte"), ("record", "truncated"),
                                             ("record", "appended"), ("lmdb", "lmdb-metadata"),
                                             ("lmdb", "truncated")])
def test_damaged_finished_shard_is_redone(source, interrupted, reference, tmp_path, caplog,
                                          data_format, how):
    dst = tmp_path / "ds"
    shutil.copytree(interrupted[data_format], dst)
    kept = _journaled(dst)
    before = _files(dst)
    _damage(dst / kept[1], how)
    with caplog.at_level("WARNING", logger="dlpack_io.packer.conversion"):
        result = convert(source, dst, resume=True, format=data_format, **API)
    assert any(f"shard {kept[1]} from the interrupted run is damaged; redoing from there"
               in r.getMessage() for r in caplog.records)
    after = _files(dst)
    assert after[kept[0]] == before[kept[0]]  # the shard before it is kept as it was
    assert after[kept[1]][3] == before[kept[1]][3]  # rewritten with the original bytes
    assert result["resumed_from"] == json.loads(
        (interrupted[data_format] / journal.JOURNAL_NAME).read_text().splitlines()[1])["end_input"]
    assert dataset_fingerprint(dst) == reference[data_format]
    assert verify(dst, progress=False).ok
