"""The golden batches (tests/golden.py) over s3://: the golden data sets uploaded to a real
S3 server give exactly the batches pinned for them on disk, with every worker kind, with a
cache that keeps everything and with one that keeps almost nothing."""
from __future__ import annotations

import pytest

import golden
from helpers import upload_folder

PINNED = golden.load()
ROOT = "s3://dlpack-test/golden"
CASES = ("rrc-flip-normalize", "rrc-uint8-targets", "pad-detection", "raw-random-crop",
         "mixture", "block-drop-last-rank1", "aspect-buckets",
         "token-budget")  # LMDB shards are read locally only


@pytest.fixture(scope="module")
def uploaded(s3_server):
    for name in ("photos", "raw"):
        upload_folder(golden.DATA / name, f"{ROOT}/{name}", s3_server.env())
    return ROOT


@pytest.mark.parametrize("workers", sorted(golden.WORKERS))
@pytest.mark.parametrize("case", CASES)
def test_remote_batches_are_the_pinned_ones(s3_env, uploaded, case, workers):
    assert golden.run_case(case, workers, root=uploaded) == PINNED["cases"][case]


def test_remote_batches_with_a_small_cache_are_the_pinned_ones(s3_env, uploaded, monkeypatch):
    """A cache_limit of about two batches: every epoch fetches again, batches unchanged."""
    from dlpack_io.reader import Dataset, Loader

    set_name, kwargs = golden.cases()["rrc-flip-normalize"]
    ds = Dataset(f"{uploaded}/{set_name}", cache_limit=70_000)
    with Loader(ds, **golden.options(kwargs)) as loader:
        assert golden.epochs(loader) == PINNED["cases"]["rrc-flip-normalize"]
