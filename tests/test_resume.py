"""A conversion killed with SIGKILL, then --resume: the same bytes as an uninterrupted run."""
import os
import signal
import subprocess
import sys
import time

import pytest

from dlpack_io.packer import convert
from dlpack_io.packer.journal import JOURNAL_NAME
from dlpack_io.tools.synth import make_image_folder

from helpers import dataset_fingerprint

OPTIONS = ["--shard-size", "60KB", "--workers", "2", "--quiet"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_src")
    make_image_folder(root, 600, 4, seed=3, size=(64, 80))
    (root / "class_01" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    return root


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    dst = tmp_path_factory.mktemp("resume_ref") / "ds"
    convert(source, dst, shard_size="60KB", workers=1, progress=False)
    return dataset_fingerprint(dst)


def _cli(*args):
    return [sys.executable, "-m", "dlpack_io.tools.cli", "convert", *map(str, args), *OPTIONS]


def _shards_journaled(dst) -> int:
    try:
        with open(os.path.join(dst, JOURNAL_NAME)) as f:
            return max(0, len(f.read().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def _kill_after(cmd, dst, shards: int, extra_delay: float) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while _shards_journaled(dst) < shards and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(extra_delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


# Kill points: before any shard, between shards, mid-shard, and around the very end.
@pytest.mark.parametrize("shards,delay", [(0, 0.0), (0, 0.15), (1, 0.0), (3, 0.01), (7, 0.003),
                                          (12, 0.0), (18, 0.002), (26, 0.0), (34, 0.0)])
def test_kill_then_resume_is_identical(source, reference, tmp_path, shards, delay):
    dst = tmp_path / "ds"
    _kill_after(_cli(source, dst), dst, shards, delay)
    assert not (dst / "manifest.json").exists(), "the kill came too late to test anything"
    done = subprocess.run(_cli(source, dst, "--resume"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert dataset_fingerprint(dst) == reference


def test_killed_convert_leaves_no_orphan_workers(source, tmp_path):
    dst = tmp_path / "ds"
    proc = subprocess.Popen(_cli(source, dst), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while _shards_journaled(dst) < 1 and proc.poll() is None:
        time.sleep(0.005)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    alive = [pid for pid in children if os.path.exists(f"/proc/{pid}") and
             "Z" not in open(f"/proc/{pid}/stat").read().split()[2]]
    assert alive == []


def _kill_at(cmd, delay: float) -> bool:
    """Start a conversion, SIGKILL it after ``delay`` s; True if it was still running."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


@pytest.mark.slow
def test_sigkill_at_24_random_moments_then_resume(source, reference, tmp_path):
    """24 kills at seeded random moments across a whole run (start-up and imports included),
    each followed by --resume: identical output every time. Results feed docs/reliability.md."""
    import random
    import time as clock

    dst0 = tmp_path / "timing"
    start = clock.monotonic()
    subprocess.run(_cli(source, dst0), check=True, capture_output=True, timeout=120)
    duration = clock.monotonic() - start
    rng = random.Random(2026)
    interrupted = 0
    for k in range(24):
        dst = tmp_path / f"ds{k}"
        interrupted += _kill_at(_cli(source, dst), rng.uniform(0.05, 1.0) * duration)
        done = subprocess.run(_cli(source, dst, "--resume"), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert dataset_fingerprint(dst) == reference, f"kill {k} changed the output"
    assert interrupted >= 18, f"only {interrupted} of 24 kills landed before the end"
