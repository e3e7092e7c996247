"""A conversion killed with SIGKILL, then --resume: the same bytes as an uninterrupted run.

The kills land at progress events, not at moments in time: the conversion stops itself
(SIGSTOP) when it reaches the chosen point (a record added, a shard journaled, the
manifest written; tests/helpers.py STOPPING_CONVERT) and is SIGKILLed there, so every
kill interrupts the run exactly where the test says, however loaded the machine is.
"""
import random

import pytest

from dlpack_io.packer import convert

from helpers import convert_stopped_at, dataset_fingerprint, gone, photo_folder, wait_until

# the source holds one planted reject: --max-rejects 1 accepts it (exit 0, not 3)
OPTIONS = ["--shard-size", "60KB", "--workers", "2", "--quiet", "--max-rejects", "1"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("resume_src"), 600, 4, seed=3, size=(64, 80),
                        broken_in="class_01")


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    """(fingerprint, records per shard) of an uninterrupted run."""
    from dlpack_io.reader import Dataset

    dst = tmp_path_factory.mktemp("resume_ref") / "ds"
    convert(source, dst, shard_size="60KB", workers=1, progress=False)
    counts = [s["num_samples"] for s in Dataset(dst).manifest["shards"]]
    assert len(counts) > 20  # the kill points below need this many shards
    return dataset_fingerprint(dst), counts


def _resume(source, dst):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "dlpack_io.tools.cli", "convert", str(source),
                           str(dst), *OPTIONS, "--resume"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done


# Kill points: before anything is written, in the middle of the first and of later shards,
# right after a shard was journaled (early, middle, the last one), and after the manifest
# landed but before the journal was removed. "-1" counts from the last shard.
@pytest.mark.parametrize("stop", ["startup", "record:0:1", "journal:1", "record:3:5",
                                  "journal:7", "journal:12", "record:18:1", "journal:-2",
                                  "journal:-1", "record:-1:2", "manifest"])
def test_kill_then_resume_is_identical(source, reference, tmp_path, stop):
    fingerprint, counts = reference
    kind, *args = stop.split(":")
    args = [int(a) for a in args]
    if kind == "journal" and args[0] < 0:  # journal:-1 is the last shard
        args[0] += len(counts) + 1
    if kind == "record" and args[0] < 0:
        args = [args[0] + len(counts), min(args[1], counts[args[0]])]
    stop = ":".join([kind, *map(str, args)])
    dst = tmp_path / "ds"
    convert_stopped_at(stop, [source, dst, *OPTIONS])
    assert (dst / "manifest.json").exists() == (kind == "manifest")
    _resume(source, dst)
    assert dataset_fingerprint(dst) == fingerprint


def test_killed_convert_leaves_no_orphan_workers(source, tmp_path):
    dst = tmp_path / "ds"
    children = convert_stopped_at("journal:1", [source, dst, *OPTIONS])
    assert len(children) >= 2, "the encoding workers were not found: nothing would be tested"
    wait_until(lambda: all(gone(pid) for pid in children), what="the workers' exit")


def _random_stop(rng: random.Random, counts: list) -> str:
    """A seeded random progress point anywhere in a run, start-up and the end included."""
    k = rng.randrange(len(counts))
    return rng.choice(["startup", f"record:{k}:{rng.randint(1, counts[k])}",
                       f"journal:{k + 1}", f"record:{k}:{rng.randint(1, counts[k])}",
                       "manifest" if k == len(counts) - 1 else f"journal:{k + 1}"])


@pytest.mark.slow
def test_sigkill_at_24_random_moments_then_resume(source, reference, tmp_path):
    """24 kills at seeded random progress points across a whole run, each followed by
    --resume: identical output every time. Every kill lands before the end by
    construction (the run stops itself at the point), whatever the load."""
    fingerprint, counts = reference
    rng = random.Random(2026)
    stops = [_random_stop(rng, counts) for _ in range(24)]
    assert len({s.split(":")[0] for s in stops}) >= 3  # start-up, mid-shard, journaled...
    for k, stop in enumerate(stops):
        dst = tmp_path / f"ds{k}"
        convert_stopped_at(stop, [source, dst, *OPTIONS])
        _resume(source, dst)
        assert dataset_fingerprint(dst) == fingerprint, f"kill {k} at {stop} changed the output"
