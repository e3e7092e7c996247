"""The reader under faults (issue 6): corrupt records met mid-epoch (raise / skip), many
reader processes on the same shards, Ctrl-C and a killed trainer, and resume after an
interrupted epoch. Results feed docs/reliability.md.

Already covered in tests/batch/test_loader_failures.py (not repeated here): a corrupt JPEG with
on_error="raise" for thread/process workers x host/device transforms, a worker process
killed mid-epoch, break / exception / in-process SIGINT with process workers.
"""
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dlpack_io.reader import (Dataset, Loader, Output, RandomCrop, RandomResizedCrop, SampleError,
                              WorkerError, Workers)

from helpers import shared_memory_of, wait_until

N = 64
BAD = (5, 36, 37)  # in storage order: 36 and 37 share a batch of 8, and fill a batch of 2


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """(root) with jpeg/, raw/ (40x40 raw records) and lmdb/ data sets of N samples."""
    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("reliability")
    make_image_folder(root / "src", N, 4, seed=3, size=(48, 64))
    common = dict(shard_size="60KB", workers=1, progress=False, overwrite=True)
    convert(root / "src", root / "jpeg", mode="jpeg", **common)
    convert(root / "src", root / "raw", mode="raw", size=40, **common)
    convert(root / "src", root / "lmdb", mode="jpeg", format="lmdb", **common)
    return root


pytestmark = pytest.mark.usefixtures("hang_deadline")


def _corrupt_copy(src, dst, samples=BAD) -> dict:
    """Copy a record data set and flip (XOR 0xFF) 16 bytes at the start of each sample's
    payload (CRCs left stale); return {sample: (shard file name, record)}."""
    shutil.copytree(src, dst)
    ds, out = Dataset(dst), {}
    for i in samples:
        shard, record = ds.locate(i)
        _, entry = ds.record(i)
        path = ds.shards[shard].path
        with open(path, "r+b") as f:
            f.seek(int(entry["offset"]))
            data = bytes(b ^ 0xFF for b in f.read(16))
            f.seek(int(entry["offset"]))
            f.write(data)
        out[i] = (os.path.basename(path), record)
    return out


@pytest.fixture(scope="module")
def corrupt_jpeg(packed, tmp_path_factory):
    dst = tmp_path_factory.mktemp("corrupt") / "jpeg"
    return dst, _corrupt_copy(packed / "jpeg", dst)


@pytest.fixture(scope="module")
def corrupt_raw(packed, tmp_path_factory):
    dst = tmp_path_factory.mktemp("corrupt") / "raw"
    return dst, _corrupt_copy(packed / "raw", dst, samples=(20,))


def _epoch(loader):
    """Index arrays of one epoch's batches (the loader must have return_index=True)."""
    return [idx.copy() for _, _, idx in loader]


WORKERS = [dict(num_workers=0), dict(num_workers=2, worker_kind="thread"),
           dict(num_workers=2, worker_kind="process"),
           dict(num_workers=2, worker_kind="thread", device_transforms=True),
           dict(num_workers=2, worker_kind="process", device_transforms=True)]
IDS = ["serial", "threads", "processes", "threads-device", "processes-device"]


@pytest.mark.parametrize("workers", WORKERS, ids=IDS)
def test_skip_leaves_out_exactly_the_bad_samples(corrupt_jpeg, workers, caplog):
    path, bad = corrupt_jpeg
    loader = Loader(Dataset(path), batch_size=8, transforms=[RandomResizedCrop(24)], shuffle="global",
                    drop_last=False, output=Output(return_index=True),
                    workers=Workers(on_error="skip"), **workers)
    with caplog.at_level(logging.WARNING, logger="dlpack_io.reader.batch.errors"):
        batches = [(images.shape[0], labels.shape[0], idx.copy()) for images, labels, idx in loader]
    seen = np.concatenate([idx for _, _, idx in batches])
    assert all(a == b == len(idx) for a, b, idx in batches)  # shorter batch, consistent parts
    assert sorted(seen.tolist()) == sorted(set(range(N)) - set(bad))  # every other sample once
    assert len(loader.skipped) == loader.skipped.total == len(bad)
    assert {s.sample for s in loader.skipped} == set(bad)
    for s in loader.skipped:
        shard_name, record = bad[s.sample]
        assert shard_name in s.where and f"record {record}" in s.where and "JPEG" in s.reason
    warnings = [r for r in caplog.records if "skipped 3 unreadable" in r.getMessage()]
    assert len(warnings) == 1
    loader.set_epoch(1)  # the account is per epoch; the total keeps counting
    assert sorted(np.concatenate(_epoch(loader)).tolist()) == sorted(set(range(N)) - set(bad))
    assert len(loader.skipped) == 3 and loader.skipped.total == 6 and loader.skipped.epoch == 1
    loader.skipped.reset()
    assert loader.skipped.total == 0 and len(loader.skipped) == 0


def test_skip_is_deterministic_across_worker_kinds(corrupt_jpeg):
    path, _ = corrupt_jpeg
    runs = []
    for workers in WORKERS[:3]:
        loader = Loader(Dataset(path), batch_size=8, transforms=[RandomResizedCrop(24)], seed=7,
                        output=Output(return_index=True), workers=Workers(on_error="skip"),
                        drop_last=False, **workers)
        runs.append([(idx.tolist(), images.numpy().tobytes()) for images, _, idx in loader])
    assert runs[0] == runs[1] == runs[2]


def test_raise_policy_stops_at_the_bad_record_serially(corrupt_jpeg):
    """(Threads/processes x host/device: tests/batch/test_loader_failures.py.)"""
    path, bad = corrupt_jpeg
    loader = Loader(Dataset(path), batch_size=8, transforms=[RandomResizedCrop(24)], shuffle=None,
                    num_workers=0)
    got = 0
    shard_name, record = bad[5]
    with pytest.raises(SampleError, match=rf"{shard_name} record {record} \(sample 5\)"):
        for _ in loader:
            got += 1
    assert got == 5 // 8  # batch 0 holds sample 5: nothing before it


def test_a_batch_whose_samples_all_fail_is_not_yielded(corrupt_jpeg):
    path, bad = corrupt_jpeg
    loader = Loader(Dataset(path), batch_size=2, transforms=[RandomResizedCrop(24)], shuffle=None,
                    num_workers=2, output=Output(return_index=True),
                    workers=Workers(on_error="skip"))
    batches = _epoch(loader)
    assert len(batches) == len(loader) - 1  # batch 18 = samples 36, 37: not yielded
    assert [len(b) for b in batches].count(1) == 1  # batch 2 = samples 4, 5
    # the skipped batch still counts: the state points at the start of the next epoch
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["segments"] == []


@pytest.mark.parametrize("workers", WORKERS[:3] + WORKERS[4:], ids=IDS[:3] + IDS[4:])
def test_corrupt_raw_record_needs_verify_checksums(corrupt_raw, workers):
    path, bad = corrupt_raw
    shard_name, record = bad[20]
    kw = dict(batch_size=8, shuffle=None, return_index=True, drop_last=False, **workers)
    # Raw pixels have no structure to fail on: only the CRC can tell.
    assert len(np.concatenate(_epoch(Loader(Dataset(path), **kw)))) == N
    strict = Dataset(path, verify_checksums=True)
    got = 0
    with pytest.raises(SampleError, match="checksum mismatch") as info:
        for _ in Loader(strict, **kw):
            got += 1
    assert got == 20 // 8 and f"{shard_name} record {record} (sample 20)" in str(info.value)
    loader = Loader(strict, workers=Workers(on_error="skip"), **kw)
    assert sorted(np.concatenate(_epoch(loader)).tolist()) == [i for i in range(N) if i != 20]
    assert [s.sample for s in loader.skipped] == [20]


def test_skip_drops_samples_a_transform_cannot_apply_to(packed):
    ds = Dataset(packed / "jpeg")
    _, _, entries = ds.lookup(np.arange(N))
    size = int(np.percentile(entries["height"], 30))
    small = set(np.flatnonzero((entries["height"] < size) | (entries["width"] < size)).tolist())
    assert 0 < len(small) < N
    loader = Loader(ds, batch_size=8, transforms=[RandomCrop(size)], num_workers=2,
                    output=Output(return_index=True), workers=Workers(on_error="skip"),
                    drop_last=False)
    assert sorted(np.concatenate(_epoch(loader)).tolist()) == sorted(set(range(N)) - small)
    assert {s.sample for s in loader.skipped} == small
    assert all("crops do not pad" in s.reason for s in loader.skipped)


def test_on_error_is_validated(packed):
    with pytest.raises(ValueError, match="on_error='ignore'.*'raise'.*'skip'"):
        Loader(Dataset(packed / "jpeg"), workers=Workers(on_error="ignore"))


# ---- many readers on the same shards ------------------------------------------------

READERS = textwrap.dedent("""
    import hashlib, multiprocessing as mp, sys
    from dlpack_io.reader import Dataset
    from dlpack_io.reader import format as fmt

    def read_all(path):
        ds = Dataset(path)
        h = hashlib.sha256()
        for i in range(len(ds)):
            payload, entry = ds.record(i)
            if fmt.crc32(payload) != int(entry["crc"]):
                raise SystemExit(f"sample {i}: CRC mismatch")
            h.update(payload)
        return ds, h.hexdigest()

    def reader(path, barrier, out):
        ds, first = read_all(path)  # environments / mmaps stay open across the barrier
        barrier.wait(600)           # every reader holds the data set open at once
        _, second = read_all(path)
        out.put((first, second, len(ds)))

    if __name__ == "__main__":
        path, n = sys.argv[1], int(sys.argv[2])
        ctx = mp.get_context("fork")
        barrier, out = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=reader, args=(path, barrier, out)) for _ in range(n)]
        for p in procs:
            p.start()
        results = [out.get(timeout=600) for _ in range(n)]  # hang guards
        for p in procs:
            p.join(60)
        codes = [p.exitcode for p in procs]
        print(len(set(results)), len(results), sorted(set(codes)), results[0][2])
""")


@pytest.mark.parametrize("kind,readers", [("lmdb", 160), ("record", 64)])
def test_many_reader_processes_on_the_same_shards(packed, tmp_path, kind, readers):
    """160 > LMDB's default 126 reader slots: our envs are lock=False, so there is no
    reader table to fill. Every process reads every record twice and checks its CRC."""
    script = tmp_path / "readers.py"
    script.write_text(READERS)
    path = packed / ("lmdb" if kind == "lmdb" else "jpeg")
    done = subprocess.run([sys.executable, str(script), str(path), str(readers)],
                          capture_output=True, text=True, timeout=900)  # a hang guard only
    assert done.returncode == 0, done.stderr[-3000:]
    distinct, count, codes, samples = done.stdout.split(maxsplit=3)
    assert (distinct, count, codes.strip(), samples.strip()) == ("1", str(readers), "[0]", str(N))


# ---- Ctrl-C / a killed trainer: no hang, no orphan, no leaked shared memory -----------

TRAINER = textwrap.dedent("""
    import os, sys, time
    from dlpack_io.reader import Dataset, Loader, RandomResizedCrop
    kind = sys.argv[2]
    loader = Loader(Dataset(sys.argv[1]), batch_size=4, transforms=[RandomResizedCrop(24)],
                    num_workers=2, worker_kind=kind)
    for epoch in range(10**6):
        loader.set_epoch(epoch)
        for images, labels in loader:
            if epoch == 0:
                print("READY", *loader.worker_pids(), flush=True)
            time.sleep(0.02)  # "training"
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] not in "ZX"
    except FileNotFoundError:
        return False


def _torch_shm_named_after(pids) -> list:
    """/dev/shm entries torch names after a process (``torch_<pid>_...``) of ``pids``: what
    a process that died without cleaning up would leave behind."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return [n for n in names if any(n.startswith(f"torch_{pid}_") for pid in pids)]


def _start_trainer(packed, tmp_path, kind):
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen([sys.executable, str(script), str(packed / "jpeg"), kind],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    line = proc.stdout.readline()
    assert line.startswith("READY"), proc.stderr.read()[-3000:]
    return proc, [int(p) for p in line.split()[1:]]


@pytest.mark.parametrize("kind", ["process", "thread"])
@pytest.mark.parametrize("target", ["trainer", "process-group"])
def test_sigint_to_a_training_process(packed, tmp_path, kind, target):
    """Ctrl-C at a terminal signals the whole process group; `kill -INT` only the trainer."""
    proc, workers = _start_trainer(packed, tmp_path, kind)
    assert len(workers) == (2 if kind == "process" else 0)
    assert shared_memory_of([proc.pid, *workers]) == []  # the batch slots are anonymous mappings
    if target == "trainer":
        proc.send_signal(signal.SIGINT)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)  # a hang guard, not a speed requirement
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the training process hung after SIGINT")
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
    assert err.strip().splitlines()[-1] == "KeyboardInterrupt", err[-2000:]  # nothing else
    wait_until(lambda: not any(_alive(p) for p in workers), what="the workers' exit")
    assert _torch_shm_named_after([proc.pid, *workers]) == []


def test_sigkill_of_the_trainer_takes_its_workers_along(packed, tmp_path):
    """kill -9 (or the OOM killer) on the training process: PR_SET_PDEATHSIG ends the
    workers; their anonymous shared memory goes with them."""
    proc, workers = _start_trainer(packed, tmp_path, "process")
    assert len(workers) == 2 and all(_alive(p) for p in workers)
    assert shared_memory_of([proc.pid, *workers]) == []
    proc.send_signal(signal.SIGKILL)
    proc.wait(120)
    wait_until(lambda: not any(_alive(p) for p in workers), what="the workers' exit")
    assert _torch_shm_named_after([proc.pid, *workers]) == []


# ---- an interrupted epoch, resumed from state_dict(): every sample exactly once -------

def _interrupt(loader, how: str, after: int):
    """Consume ``after`` batches then stop as ``how``; return the indices delivered."""
    seen, raised = [], None
    try:
        for k, (_, _, idx) in enumerate(loader):
            seen.append(idx.copy())
            if k + 1 == after:
                if how == "break":
                    break
                if how == "exception":
                    raise RuntimeError("the training step failed")
                victim = loader.worker_pids()[0]
                os.kill(victim, signal.SIGKILL)
                wait_until(lambda: not _alive(victim), what="the killed worker's exit")
    except WorkerError as exc:
        assert how == "kill-worker" and "was killed by SIGKILL while building batch" in str(exc)
        raised = "kill-worker"
    except RuntimeError as exc:
        assert how == "exception" and "training step" in str(exc)
        raised = "exception"
    assert raised == (None if how == "break" else how)  # the interruption really happened
    return seen


@pytest.mark.parametrize("first,second,how", [
    (dict(num_workers=2, worker_kind="thread"), dict(num_workers=3, worker_kind="process"), "break"),
    (dict(num_workers=2, worker_kind="process"), dict(num_workers=0), "exception"),
    (dict(num_workers=2, worker_kind="process", prefetch=2), dict(num_workers=1), "kill-worker"),
    (dict(num_workers=0), dict(num_workers=2, worker_kind="thread"), "exception"),
])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_interrupted_epoch_resumes_every_sample_exactly_once(packed, corrupt_jpeg, first,
                                                             second, how, on_error):
    path = corrupt_jpeg[0] if on_error == "skip" else packed / "jpeg"
    kw = dict(batch_size=6, transforms=[RandomResizedCrop(24)], seed=11, shuffle="global",
              drop_last=False, return_index=True, on_error=on_error)
    a = Loader(Dataset(path), **kw, **first)
    a.set_epoch(3)
    seen = _interrupt(a, how, after=4)
    state = json.loads(json.dumps(a.state_dict()))  # what a checkpoint stores
    assert state["epoch"] == 3 and state["segments"][-1]["batches"] == len(seen)
    b = Loader(Dataset(path), **kw, **second)
    b.load_state_dict(state)
    b.set_epoch(3)
    seen += _epoch(b)
    got = np.concatenate(seen)
    expected = set(range(N)) - (set(BAD) if on_error == "skip" else set())
    assert len(got) == len(set(got.tolist())) and set(got.tolist()) == expected
    reference = Loader(Dataset(path), **kw, num_workers=0)
    reference.set_epoch(3)
    assert [s.tolist() for s in seen] == [s.tolist() for s in _epoch(reference)]
