"""A cache_dir whose file system fills up: records stop being kept for later epochs (one
warning naming the folder and the fix), reading goes on streamed through the session, and
a file system with no room even to set the cache up is an error naming cache_dir and the
fix, never a bare "No space left on device". Real file systems: a small tmpfs mounted in a
mount namespace of the child's own (``unshare``), real SeaweedFS."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from helpers import pack_and_upload

URL = "s3://dlpack-test/full/base"
CHILD = os.path.join(os.path.dirname(__file__), "full_child.py")


def _in_small_fs(tmp_path, size: str, action: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "small"
    folder.mkdir(exist_ok=True)
    mount = f"mount -t tmpfs -o size={size} tmpfs {folder} && exec {sys.executable} {CHILD} " \
            f"{URL} {folder} {action}"
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mount]
                          if os.geteuid() else ["unshare", "--mount", "sh", "-c", mount],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def uploaded(tmp_path_factory, s3_server):
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to mount a small tmpfs of its own")
    return pack_and_upload(tmp_path_factory.mktemp("full"), URL, s3_server.env(), count=200,
                           classes=2, seed=5, size=(96, 128))


def _needs_namespace(done) -> None:
    if "unshare:" in done.stderr or "mount:" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a namespace here: {done.stderr.strip()[:200]}")


def test_a_full_cache_dir_keeps_nothing_more_and_reading_goes_on(s3_env, uploaded, tmp_path):
    done = _in_small_fs(tmp_path, "4m", "stream")
    _needs_namespace(done)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["200", "200"]  # two whole epochs, streamed
    assert "the cache_dir's file system is full, so no more records are kept" in done.stderr
    assert "pass a smaller cache_limit, or another cache_dir" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_batch_released_while_a_write_fails_is_room_for_it(s3_env, uploaded, tmp_path):
    """A loaded CI machine, by chance: batch 6's write found no room, the consumer released
    batch 5 before the planner looked, and the planner saw nothing more to free: "no room
    for the records of batch 6, even streamed" with the room right there. The order is
    forced here (full_child.py's ``release``); the old code failed it every time."""
    done = _in_small_fs(tmp_path, "4m", "release")
    _needs_namespace(done)
    assert done.returncode == 0, done.stderr[-3000:]
    failures, read = done.stdout.split()
    assert int(failures) >= 1 and read == "read", done.stdout  # the write did fail first


def test_no_room_to_set_the_cache_up_names_cache_dir_and_the_fix(s3_env, uploaded, tmp_path):
    done = _in_small_fs(tmp_path, "64k", "setup")
    _needs_namespace(done)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("OSError: [Errno 28] No space left on device: cannot set up "
                                  "the cache "
                                  f"of {URL} in cache_dir {tmp_path / 'small' / 'c'}; free "
                                  f"space there, or pass another cache_dir"), done.stdout
