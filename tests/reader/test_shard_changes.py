"""Shards that change under a running reader (issue 13 item 1).

* ``Shard.check_unchanged`` / ``Dataset.check_unchanged`` name a shard truncated or
  rewritten in place; a shard replaced by rename (what our own commands do) is not an
  error: the open map still holds the old, intact file.
* A truncation that races every check: the native copy and decode code turns the SIGBUS
  into an exception naming the shard, for thread and process workers alike (the loader
  runs in a child process, so a SIGBUS that escaped would show as its exit status).

The Loader tests here use the Loader API of the re-cut (transforms=[...]); they are
``test_truncated_under_a_running_loader`` only.
"""
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dlpack_io.reader import Dataset, jpegdecode
from dlpack_io.reader import format as fmt
from dlpack_io.reader.shard import ShardChangedError

from helpers import pack_jpeg_and_raw


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    modes = ("jpeg", "raw", "planes") if jpegdecode.have_extension() else ("jpeg", "raw")
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("changes"), 64, 4, seed=9,
                             shard_size="60KB", modes=modes)


@pytest.fixture
def raw_copy(packed, tmp_path):
    dst = tmp_path / "raw"
    shutil.copytree(packed["raw"], dst)
    return dst


def _open_all(ds):
    return [ds.record(i)[0] for i in range(len(ds))]


def test_truncation_in_place_is_named(raw_copy):
    ds = Dataset(raw_copy)
    _open_all(ds)
    ds.check_unchanged()  # nothing changed yet
    path = ds.shards[1].path
    size = os.path.getsize(path)
    os.truncate(path, fmt.HEADER_SIZE)
    with pytest.raises(ShardChangedError, match=f"{path}: changed on disk while this process "
                                                f"was reading it \\({size} bytes when opened, "
                                                f"{fmt.HEADER_SIZE} now\\)") as info:
        ds.check_unchanged([0, 1, 1, 2])
    assert isinstance(info.value, fmt.FormatError) and info.value.path == path
    ds.check_unchanged([0, 2])  # the others are fine


def test_truncation_between_the_checks_and_the_map_is_named(raw_copy, monkeypatch):
    """The race a process worker hit under load: the shard shrinks after its header and
    index were read and checked, just before it is mapped (was: ValueError "mmap length is
    greater than file size", naming nothing)."""
    from dlpack_io.reader import shard as shard_module

    ds = Dataset(raw_copy)
    path = ds.shards[1].path
    size = os.path.getsize(path)
    real_mmap = shard_module.mmap.mmap

    def truncate_then_map(fd, length, **kwargs):
        if os.readlink(f"/proc/self/fd/{fd}") == str(path):
            os.truncate(path, size - 1)  # another process cuts the file right now
        return real_mmap(fd, length, **kwargs)
    monkeypatch.setattr(shard_module.mmap, "mmap", truncate_then_map)
    with pytest.raises(ShardChangedError, match=f"{path}: changed on disk while this process "
                                                f"was reading it \\({size} bytes when opened, "
                                                f"{size - 1} now\\)"):
        _open_all(ds)


AFTER_ANOTHER_HANDLER = textwrap.dedent("""
    import os, signal, sys
    from dlpack_io.reader import Dataset
    ds = Dataset(sys.argv[1])
    ds[0]                                       # the extension is loaded, its guard set
    signal.signal(signal.SIGBUS, signal.SIG_DFL)  # as ray.init + ray.shutdown leave it
    os.truncate(ds.shards[0].path, 4096)
    try:
        ds[1]
    except Exception as exc:
        print("RAISED", exc)
""")


@pytest.mark.skipif(not jpegdecode.have_extension(), reason="the SIGBUS guard is in the C extension")
def test_the_guard_survives_another_library_replacing_the_sigbus_handler(raw_copy):
    """Ray's driver replaces the SIGBUS handler at ray.init and leaves the default after
    ray.shutdown: a later truncated shard killed the process (exit 135) instead of raising."""
    done = subprocess.run([sys.executable, "-c", AFTER_ANOTHER_HANDLER, str(raw_copy)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"died ({done.returncode}): {done.stderr[-2000:]}"
    assert done.stdout.startswith("RAISED") and "bus error reading" in done.stdout, done.stdout


def test_rewrite_in_place_with_the_same_size_is_named(raw_copy):
    ds = Dataset(raw_copy)
    _open_all(ds)
    path = ds.shards[0].path
    st = os.stat(path)
    with open(path, "r+b") as f:  # same size, new bytes, in place
        f.seek(fmt.HEADER_SIZE)
        f.write(b"\x00" * 16)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(ShardChangedError, match="modified in place: same size, new mtime"):
        ds.check_unchanged([0])


def test_a_shard_not_opened_here_is_not_checked(raw_copy):
    ds = Dataset(raw_copy)
    os.truncate(ds.shards[0].path, 0)
    ds.check_unchanged()  # nothing mapped in this process: nothing can fault


def test_overwrite_by_our_own_convert_leaves_a_running_reader_intact(packed, raw_copy, caplog):
    """dlpack convert --overwrite writes new files and renames them over the old ones:
    a reader that mapped the old shards goes on reading them, bytes and CRCs intact."""
    from dlpack_io.packer import convert

    ds = Dataset(raw_copy)
    before = [bytes(p) for p in _open_all(ds)]
    convert(Path(packed["raw"]).parent / "src", raw_copy, mode="raw", size=24, seed=5, workers=1,
            shard_size="60KB", progress=False, overwrite=True)
    assert Dataset(raw_copy).manifest["options"]["size"] == 24  # really replaced
    with caplog.at_level(logging.WARNING, logger="dlpack_io.reader.shard"):
        ds.check_unchanged()
        ds.check_unchanged()
    warned = [r.getMessage() for r in caplog.records if "this process keeps reading" in r.getMessage()]
    assert len(warned) == len(ds.shards)  # once per shard: replaced (2) or deleted (4)
    assert sum("was replaced on disk" in w for w in warned) == 2
    after = [bytes(p) for p in _open_all(ds)]
    assert after == before
    assert all(fmt.crc32(p) == int(ds.record(i)[1]["crc"]) for i, p in enumerate(after))


READ_AFTER_TRUNCATION = textwrap.dedent('''
    import os, sys
    from dlpack_io.reader import Dataset
    from dlpack_io.reader.format import FormatError
    ds = Dataset(sys.argv[1])
    print("KIND", int(ds.record(1)[1]["kind"]))
    ds[0]
    os.truncate(ds.shards[0].path, 4096)
    try:
        ds[1]
    except FormatError as exc:
        print("RAISED", exc)
''')


def _read_after_truncation(packed, tmp_path, mode: str) -> str:
    """Dataset[1] of a copy of ``packed[mode]`` whose first shard is truncated after open,
    in a child (a SIGBUS that escaped would be its exit status): its stdout."""
    path = tmp_path / mode
    shutil.copytree(packed[mode], path)
    done = subprocess.run([sys.executable, "-c", READ_AFTER_TRUNCATION, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "\nRAISED " in done.stdout, done.stdout
    return done.stdout


@pytest.mark.skipif(not jpegdecode.have_extension(), reason="the SIGBUS guard is in the C extension")
def test_dataset_survives_a_truncation_after_open(packed, tmp_path):
    """Dataset[i] of a raw record reads through the guarded copy: a shard truncated after
    it was opened is an error naming it."""
    out = _read_after_truncation(packed, tmp_path, "raw")
    assert "shard-00000.rec record 1 (sample 1): gather: bus error reading byte 0" in out


@pytest.mark.skipif(not jpegdecode.have_extension(), reason="the SIGBUS guard is in the C extension")
def test_planes_read_in_place_survive_a_truncation(packed, tmp_path):
    """A planes record is decoded straight from the mapped shard (no copy): a truncation
    after open is still an error naming the shard and the record, not a SIGBUS."""
    out = _read_after_truncation(packed, tmp_path, "planes")
    assert out.startswith(f"KIND {fmt.KIND_PLANES}\n"), out
    assert "shard-00000.rec record 1 (sample 1): cannot decode planes payload " \
           "(decode_region: bus error reading byte 0" in out, out


CHILD = textwrap.dedent('''
    import os, sys
    from dlpack_io.reader import Dataset, Loader, RandomCrop, RandomResizedCrop
    from dlpack_io.reader.format import FormatError
    from dlpack_io.reader.batch.errors import LoaderError
    path, mode, kind = sys.argv[1:4]
    crop = RandomCrop(24) if mode == "raw" else RandomResizedCrop(24)
    ds = Dataset(path)
    loader = Loader(ds, batch_size=4, num_workers=2, worker_kind=kind, shuffle=None,
                    transforms=[crop], prefetch=2)
    batches = 0
    try:
        for images, labels in loader:
            batches += 1
            if batches == 1:  # truncate every shard under the running workers
                for shard in ds.shards:
                    os.truncate(shard.path, 4096)
        print("COMPLETED", batches)
    except (LoaderError, FormatError) as exc:
        print("RAISED", batches, type(exc).__name__, str(exc).replace("\\n", " ")[:600])
''')


@pytest.mark.skipif(not jpegdecode.have_extension(), reason="the SIGBUS guard is in the C extension")
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("mode", ["raw", "jpeg", "planes"])
def test_truncated_under_a_running_loader(packed, tmp_path, mode, kind):
    """Before: "Bus error", exit 135, no message (2 thread workers, shards truncated after
    the first batch)."""
    path = tmp_path / mode
    shutil.copytree(packed[mode], path)
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), mode, kind],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the loader process died ({done.returncode}): {done.stderr[-2000:]}"
    outcome = done.stdout.split()
    assert outcome[0] == "RAISED", done.stdout
    # which check fires first depends on when each worker maps the shard: a worker that
    # opens it only after the truncation finds its layout broken ("... or damaged") or its
    # index cut short (shard.pread_all: "file ended at N while reading ...")
    assert "shard-0000" in done.stdout and (
        "bus error reading" in done.stdout or "changed on disk" in done.stdout
        or "the shard is truncated" in done.stdout), done.stdout


@pytest.mark.skipif(not jpegdecode.have_extension(), reason="the SIGBUS guard is in the C extension")
def test_a_changed_shard_is_not_skipped_like_a_bad_sample(packed):
    """on_error="skip" leaves bad samples out; a shard truncated or rewritten under the reader
    is no bad sample (every later read of it fails too): it is raised, not skipped."""
    from dlpack_io.reader.batch.build import BuildContext, skip_or_raise
    from dlpack_io.reader.batch.errors import SampleError
    from dlpack_io.reader.batch.plan import compile_spec
    from dlpack_io.reader.shard import ShardChangedError

    ctx = BuildContext(Dataset(packed["raw"]), compile_spec([]), skip=True)
    failed = []
    skip_or_raise(ctx, 3, ValueError("JPEG decode error: a bad sample"), failed, 0)
    assert [entry.sample for _, entry in failed] == [3]  # a bad sample is skipped
    for changed in (jpegdecode._jpeg.MappedFileError("gather: bus error reading byte 0"),
                    ShardChangedError("shard-00000.rec", "100 bytes when opened, 4096 now")):
        with pytest.raises(SampleError, match="sample 5"):
            skip_or_raise(ctx, 5, changed, failed, 1)
    assert len(failed) == 1
