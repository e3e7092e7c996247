"""Packer under hostile conditions: disk full, read-only or unwritable DST, source files
that vanish or change mid-run. The rule: a clear error naming the file, nothing that
claims to be complete but is not, and --resume finishes once the cause is gone."""
import os
import resource
import signal
import subprocess
import sys

import pytest

from dlpack_io.packer import convert
from dlpack_io.packer.records import ConversionError
from dlpack_io.reader import Dataset
from dlpack_io.reader.shard import RecordShard
from dlpack_io.tools.synth import make_image_folder
from dlpack_io.tools.verification import verify

from helpers import dataset_fingerprint

SHARD = "40KB"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults_src")
    make_image_folder(root, 120, 3, seed=5, size=(64, 80))
    return root


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    dst = tmp_path_factory.mktemp("faults_ref") / "ds"
    convert(source, dst, shard_size=SHARD, workers=0, progress=False)
    return dataset_fingerprint(dst)


def _cli(src, dst, *extra):
    return [sys.executable, "-m", "dlpack_io.tools.cli", "convert", str(src), str(dst),
            "--shard-size", SHARD, "--workers", "1", "--quiet", *extra]


def _assert_nothing_claims_completeness(dst):
    assert not (dst / "manifest.json").exists()
    for name in os.listdir(dst):
        if name.startswith("shard-"):  # a final shard name means a complete shard
            shard = RecordShard(str(dst / name))
            assert len(shard.index) > 0


def _limit_file_size(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_file_size_limit_then_resume(source, reference, tmp_path):
    dst = tmp_path / "ds"
    done = subprocess.run(_cli(source, dst), preexec_fn=_limit_file_size(30_000),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    # the first shard could not be written: nothing is left, the retry is the same command
    assert "cannot write shard" in done.stderr and "run the same command again" in done.stderr
    assert not dst.exists()
    done = subprocess.run(_cli(source, dst), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert dataset_fingerprint(dst) == reference


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); the RLIMIT_FSIZE test covers this")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_on_tmpfs_then_resume_elsewhere_identical(source, reference, small_tmpfs, tmp_path):
    dst = small_tmpfs / "ds"
    done = subprocess.run(_cli(source, dst), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "No space left" in done.stderr, done.stderr
    _assert_nothing_claims_completeness(dst)
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_tmpfs)], check=True)
    done = subprocess.run(_cli(source, dst, "--resume"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert dataset_fingerprint(dst) == reference


def test_read_only_destination(source, small_tmpfs):
    (small_tmpfs / "ds").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    with pytest.raises(ConversionError, match=r"ds: cannot create or write.*Read-only"):
        convert(source, small_tmpfs / "ds", workers=0, progress=False)


def test_destination_under_a_file(source, tmp_path):
    (tmp_path / "plain_file").write_text("x")
    with pytest.raises(ConversionError, match="plain_file/ds: cannot create"):
        convert(source, tmp_path / "plain_file" / "ds", workers=0, progress=False)


def _copy_source(source, tmp_path):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(source, src)
    return src


def test_source_file_vanishing_mid_run_is_a_named_reject(source, tmp_path, monkeypatch):
    src = _copy_source(source, tmp_path)
    victim = sorted(src.rglob("*.jpg"))[50]
    from dlpack_io.packer import packing as convert_module

    real = convert_module.encode_in_order

    def vanish_then_encode(items, options, workers, **kw):
        victim.unlink()  # after the scan, before the read
        return real(items, options, workers, **kw)

    monkeypatch.setattr(convert_module, "encode_in_order", vanish_then_encode)
    result = convert(src, tmp_path / "ds", workers=0, progress=False)
    reasons = {r["path"]: r["reason"] for r in Dataset(tmp_path / "ds").manifest["rejects"]}
    assert result["rejects"] == 1
    assert "No such file" in reasons[victim.relative_to(src).as_posix()]


def test_source_file_changing_mid_run_is_named(source, tmp_path, monkeypatch):
    src = _copy_source(source, tmp_path)
    victim = sorted(src.rglob("*.jpg"))[10]
    from dlpack_io.packer import packing as convert_module

    real = convert_module.encode_in_order

    def change_then_encode(items, options, workers, **kw):
        victim.write_bytes(victim.read_bytes() + b"\0" * 10)
        return real(items, options, workers, **kw)

    monkeypatch.setattr(convert_module, "encode_in_order", change_then_encode)
    with pytest.raises(ConversionError, match=f"{victim.name}: file changed while packing"):
        convert(src, tmp_path / "ds", workers=0, progress=False, on_error="fail")


def test_changed_source_refuses_resume(source, tmp_path):
    src = _copy_source(source, tmp_path)
    dst = tmp_path / "ds"
    sorted(src.rglob("*.jpg"))[-1].write_bytes(b"\xff\xd8 broken")  # fails after some shards
    proc = subprocess.run(_cli(src, dst, "--no-shuffle", "--on-error", "fail"),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "--resume" in proc.stderr
    victim = sorted(src.rglob("*.jpg"))[0]
    os.utime(victim, ns=(1, 1))
    with pytest.raises(ConversionError, match=r"cannot resume: the source files \(\d+ inputs, "
                                              r"but a file was renamed, relabelled or modified\)"):
        convert(src, dst, resume=True, shard_size=SHARD, workers=0, progress=False,
                shuffle=False, on_error="fail")


def test_killed_worker_is_a_clear_error_then_resume(source, reference, tmp_path, monkeypatch):
    """A worker killed (OOM killer) mid-run: ConversionError, not a hang; resume completes."""
    from dlpack_io.packer import encode

    real = encode.encode_file
    calls = {"n": 0}

    def die_on_the_fortieth(data, **options):
        calls["n"] += 1
        if calls["n"] == 40:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(data, **options)

    monkeypatch.setattr(encode, "encode_file", die_on_the_fortieth)
    dst = tmp_path / "ds"
    with pytest.raises(ConversionError, match="worker process died"):
        convert(source, dst, shard_size=SHARD, workers=1, progress=False)
    monkeypatch.setattr(encode, "encode_file", real)
    convert(source, dst, resume=True, shard_size=SHARD, workers=1, progress=False)
    assert dataset_fingerprint(dst) == reference
    assert verify(dst, progress=False).ok
