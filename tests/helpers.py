"""Helpers shared by tests (imported by path: tests/ is not a package)."""
from __future__ import annotations

import json
import os

from dlpack_io.reader import format as fmt
from dlpack_io.reader.format.schema import INPUTSTAT_NAME


def dataset_fingerprint(dst) -> dict:
    """Every file of a data set by name -> bytes, with the manifest's volatile keys dropped.

    Two conversions of the same input must have equal fingerprints. The input-stat record
    (inputstat.json: the source files' sizes and times, naming its manifest) is no part of
    the data set and is left out.
    """
    out = {}
    for name in sorted(os.listdir(dst)):
        if name == INPUTSTAT_NAME:
            continue
        path = os.path.join(dst, name)
        with open(path, "rb") as f:
            data = f.read()
        if name == fmt.MANIFEST_NAME:
            manifest = json.loads(data)
            for key in fmt.VOLATILE_MANIFEST_KEYS:
                manifest.pop(key, None)
            data = json.dumps(manifest, sort_keys=True).encode()
        out[name] = data
    return out


def random_images(n, h, w, c=3, seed=0):
    """A reproducible (n, h, w, c) uint8 batch of random pixels, for kernel tests."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, h, w, c), dtype=torch.uint8, generator=g)


def pack_jpeg_and_raw(root, count: int, classes: int, seed: int, shard_size: str,
                      modes=("jpeg", "raw")) -> dict:
    """Pack ``count`` small JPEGs (48x64) as a jpeg-mode and a raw (40x40) data set under
    ``root`` (and a planes-mode one when ``modes`` asks); return {"jpeg": path, ...}."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    make_image_folder(root / "src", count, classes, seed=seed, size=(48, 64))
    out = {}
    for mode in modes:
        size = 40 if mode == "raw" else None
        out[mode] = str(root / mode)
        convert(root / "src", out[mode], mode=mode, size=size, shard_size=shard_size, workers=1,
                progress=False, overwrite=True)
    return out


def pack_with_one_replaced(root, opts: dict):
    """12 records packed from ``root/src`` with ``opts``, then one changed input (another
    image copied over it) appended with ``--replace-changed``: retired [[old, 12]]; returns
    the data set's path."""
    import shutil

    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    make_image_folder(root / "src", 12, 2, seed=4, size=(24, 32))
    convert(root / "src", root / "ds", **opts)
    name = sorted(os.listdir(root / "src" / "class_01"))[1]
    make_image_folder(root / "other", 1, 1, seed=9, size=(24, 32))
    (other,) = os.listdir(root / "other" / "class_00")
    shutil.copy(root / "other" / "class_00" / other, root / "src" / "class_01" / name)
    convert(root / "src", root / "ds", append=True, replace_changed=True, **opts)
    return root / "ds"


# A `dlpack convert` that stops itself (SIGSTOP) at a chosen point of its progress, so a
# test can SIGKILL it exactly there: "startup" (nothing written yet), "record:K:R" (R
# records added to shard K, not finished), "journal:N" (the N-th shard journaled),
# "manifest" (the manifest renamed into place, the journal not yet removed).
STOPPING_CONVERT = '''
import os, signal, sys
from dlpack_io.packer import finalize, journal, writers

kind, *args = os.environ["DLPACK_TEST_STOP_AT"].split(":")
args = [int(a) for a in args]

def stop():
    os.kill(os.getpid(), signal.SIGSTOP)

if kind == "startup":
    stop()
elif kind == "journal":
    real_append, done = journal.Journal.append, [0]
    def append(self, entry):
        real_append(self, entry)
        done[0] += 1
        if done[0] == args[0]:
            stop()
    journal.Journal.append = append
elif kind == "record":
    for cls in (writers.RecordShardWriter, writers.LmdbShardWriter):
        def add(self, record, label, path, _real=cls.add):
            _real(self, record, label, path)
            if self.shard_number == args[0] and len(self) == args[1]:
                stop()
        cls.add = add
elif kind == "manifest":
    real_write = finalize.write_dataset_files
    def write_dataset_files(*a, **kw):
        real_write(*a, **kw)
        stop()
    finalize.write_dataset_files = write_dataset_files
else:
    raise SystemExit("unknown stop point " + kind)
from dlpack_io.tools.cli import main
sys.argv[0] = "dlpack"
main()
'''


def convert_stopped_at(stop: str, cli_args, *, deadline: float = 300.0):
    """Run ``dlpack convert *cli_args`` until it reaches ``stop`` (see STOPPING_CONVERT),
    SIGKILL it there, wait for its child processes to exit and return their pids. Fails if
    the conversion ends without reaching the point; ``deadline`` only guards against a hang."""
    import subprocess
    import sys
    import time

    env = dict(os.environ, DLPACK_TEST_STOP_AT=stop)
    proc = subprocess.Popen([sys.executable, "-c", STOPPING_CONVERT, "convert",
                             *map(str, cli_args)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    end = time.monotonic() + deadline
    try:
        while True:
            pid, status = os.waitpid(proc.pid, os.WUNTRACED | os.WNOHANG)
            if pid and os.WIFSTOPPED(status):
                break
            if pid:  # it ended without reaching the point
                proc.returncode = os.waitstatus_to_exitcode(status)
                raise AssertionError(f"convert ended (status {proc.returncode}) before "
                                     f"{stop}: {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > end:
                raise AssertionError(f"convert did not reach {stop} within {deadline} s (hung?)")
            time.sleep(0.01)
        children = [int(c) for c in subprocess.run(["pgrep", "-P", str(proc.pid)],
                                                   capture_output=True, text=True).stdout.split()]
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    # Its workers hold the DST lock until they notice the parent is gone: a caller that
    # resumes at once would otherwise meet "being written by another dlpack convert".
    wait_until(lambda: all(gone(pid) for pid in children), what="the killed run's workers")
    return children


def gone(pid: int) -> bool:
    """True when process ``pid`` no longer runs (exited, or a zombie awaiting its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] in "ZX"
    except (FileNotFoundError, ProcessLookupError):
        return True


def wait_until(condition, *, deadline: float = 60.0, what: str = "the condition") -> None:
    """Poll ``condition()`` until it is true; fail after ``deadline`` s (a hang guard only)."""
    import time

    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"{what} did not happen within {deadline} s")
        time.sleep(0.02)


def shared_memory_of(pids) -> list:
    """/dev/shm files that processes ``pids`` map or hold open: a leak can only be one of
    those (other programs' /dev/shm entries on a shared machine are not ours to judge)."""
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                found += [line.split(None, 5)[-1].strip() for line in f if "/dev/shm/" in line]
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("/dev/shm/"):
                    found.append(target)
        except FileNotFoundError:  # the process has gone: it holds nothing
            continue
    return sorted(set(found))


def compiled_variants(kernel) -> int:
    """Compiled variants a Triton kernel holds (every device)."""
    fn = kernel.jitted() if hasattr(kernel, "jitted") else kernel
    caches = getattr(fn, "device_caches", None)
    if caches is not None:  # triton 3.x: device -> (kernel cache, ...)
        return sum(len(v[0]) for v in caches.values())
    cache = getattr(fn, "cache", None)
    if isinstance(cache, dict):  # triton 2.x: device -> {key: kernel}
        return sum(len(v) for v in cache.values())
    import pytest
    import triton

    pytest.skip(f"triton {triton.__version__} keeps compiled kernels where this cannot count")


CHILD_DEADLINE = 600.0  # a hang guard only: a child test waits on a Ray cluster


def in_forked_child(test):
    """Run ``test`` (a test function; pytest still injects its fixtures) in a forked child
    process and report its outcome here: pass, the failure's traceback, or a skip.

    For tests that start a Ray driver in this process (``convert(engine="ray")``,
    ``ray.init``). Ray does not support another ray.init after ray.shutdown in one process
    (ray-project/ray#31145: background state of the first session is left behind), and the
    suite's process, after ten such sessions, once died with SIGSEGV while exiting, every
    test passed. A forked child holds one session and ends with os._exit (multiprocessing's
    way), so no Ray state reaches the suite's process or its interpreter teardown. That a
    driver exits cleanly on its own is tested too: the CLI tests run ``dlpack convert
    --engine ray`` as a process of its own and check its exit code.

    Not for a test that talks to S3: a fork copies only the calling thread, and the S3
    client's runtime threads started by earlier tests are not there (the child hangs).
    Such a test runs its driver with subprocess instead (tests/packer/test_ray_s3.py)."""
    import functools
    import multiprocessing
    import traceback

    import pytest

    def child(send, args, kwargs):
        try:
            test(*args, **kwargs)
            send.send(("passed", ""))
        except pytest.skip.Exception as e:
            send.send(("skipped", str(e)))
        except BaseException:  # noqa: BLE001 - every failure goes back to the parent
            send.send(("failed", traceback.format_exc()))

    @functools.wraps(test)
    def run(*args, **kwargs):
        ctx = multiprocessing.get_context("fork")
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=child, args=(send, args, kwargs), name=test.__name__)
        proc.start()
        send.close()  # the child holds the only writer: EOF when it dies
        try:
            if not receive.poll(CHILD_DEADLINE):  # the event: the child's report
                proc.kill()
                pytest.fail(f"{test.__name__} reported nothing within {CHILD_DEADLINE:.0f} s")
            outcome, text = receive.recv()
        except EOFError:
            proc.join()
            pytest.fail(f"{test.__name__}'s process died (exit code {proc.exitcode}) "
                        "before reporting", pytrace=False)
        finally:
            proc.join(CHILD_DEADLINE)
        if outcome == "skipped":
            pytest.skip(text)
        if outcome == "failed":
            pytest.fail(text, pytrace=False)

    return run


BROKEN_JPEG = b"\xff\xd8\xff\xe0 truncated"  # a JPEG start marker and nothing after it


def photo_folder(root, count: int, classes: int, *, seed: int, size, broken_in=None):
    """``count`` photo-like JPEGs in ``classes`` class folders under ``root`` (returned); with
    ``broken_in`` (a class folder's name) also a truncated ``broken.jpg`` there: an input
    every conversion must reject and report."""
    from dlpack_io.tools.synth import make_image_folder

    make_image_folder(root, count, classes, seed=seed, size=size)
    if broken_in is not None:
        (root / broken_in / "broken.jpg").write_bytes(BROKEN_JPEG)
    return root


def upload_folder(folder, url: str, env: dict) -> None:
    """Put every file of ``folder`` under ``url`` with the S3 endpoint and keys of ``env``
    (the process environment is restored afterwards)."""
    import os

    from dlpack_io.reader.remote.storage import Store

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        store = Store(url)
        for name in sorted(os.listdir(folder)):
            store.put_file(name, os.path.join(folder, name))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def pack_and_upload(root, url: str, env: dict, *, count: int, classes: int, seed: int,
                    size) -> str:
    """Photo-like JPEGs under ``root/src`` packed into ``root/local`` (30 KB shards, so a
    small set spans several) and uploaded under ``url``; returns the local copy's path."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    make_image_folder(root / "src", count, classes, seed=seed, size=size)
    convert(root / "src", root / "local", shard_size="30KB", workers=1, progress=False)
    upload_folder(root / "local", url, env)
    return str(root / "local")


def batches_equal(a, b) -> None:
    """Two runs of (indices, images, labels) batches (numpy arrays or CPU tensors) are the
    same, batch for batch."""
    import numpy as np

    assert len(a) == len(b) > 0
    for batch_a, batch_b in zip(a, b):
        for part_a, part_b in zip(batch_a, batch_b):
            np.testing.assert_array_equal(np.asarray(part_a), np.asarray(part_b))


class StepClock:
    """A stand-in for autotune's ``time``: ``perf_counter`` reads ``now``, which only the
    test's loop advances (each step by a cost of the test's choosing), so every figure the
    tuner measures is exact and no test waits for time."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now
