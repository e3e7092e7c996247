"""Records retired by ``convert --append --replace-changed`` (reader/format/schema.py):
the manifest's ``retired`` list read from disk is checked (pairs in range, sorted, no
record retired twice or replacing two, present exactly in a version-4 manifest), and the
sample order it gives: dense, every unretired sample at its old index, chains followed."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from dlpack_io.reader import Dataset, Mixture
from dlpack_io.reader import format as fmt
from dlpack_io.tools.verification import verify

from helpers import pack_with_one_replaced

OPTS = dict(shard_size="8KB", workers=1, progress=False, mode="raw", size=8)


@pytest.fixture(scope="module")
def replaced(tmp_path_factory):
    """A data set of 12 records, then an append replacing one changed input (13 records,
    12 samples)."""
    root = tmp_path_factory.mktemp("retired")
    return pack_with_one_replaced(root, OPTS)


def _write(tmp_path, packed, change) -> str:
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    m = json.loads((ds / fmt.MANIFEST_NAME).read_bytes())
    change(m)
    m["checksum"] = fmt.manifest_checksum(m)
    (ds / fmt.MANIFEST_NAME).write_bytes(fmt.encode_meta(m))
    return ds


@pytest.mark.parametrize("retired,match", [
    ([[3, 13]], r"retired\[0\] is \[3, 13\], expected \[old, new\] record numbers with "
                r"0 <= old < new < 13"),
    ([[12, 3]], r"retired\[0\] is \[12, 3\], expected"),
    ([[-1, 12]], r"retired\[0\] is \[-1, 12\]"),
    ([[3, 12, 1]], r"retired\[0\] is \[3, 12, 1\]"),
    ([[3, True]], r"retired\[0\] is \[3, True\]"),
    ([[3, "12"]], r"retired\[0\] is \[3, '12'\]"),
    ([3, 12], r"retired\[0\] is 3"),
    ([[4, 12], [3, 11]], r"retired is not sorted by old record, or retires a record twice"),
    ([[3, 11], [3, 12]], r"retired is not sorted by old record, or retires a record twice"),
    ([[3, 12], [4, 12]], r"retired names a record as the replacement of two"),
    ([], r"retired must be a list of 1..13 \[old, new\] pairs .*found list of 0"),
    ({"3": 12}, r"retired must be a list of 1..13 \[old, new\] pairs .*found dict"),
    ([[k, k + 1] for k in range(14)], r"retired must be a list of 1..13 .*found list of 14"),
])
def test_a_hostile_retired_list_is_refused_naming_the_manifest(replaced, tmp_path, retired,
                                                              match):
    ds = _write(tmp_path, replaced, lambda m: m.__setitem__(fmt.RETIRED_KEY, retired))
    with pytest.raises(fmt.FormatError, match=f"^{ds / fmt.MANIFEST_NAME}: {match}"):
        Dataset(ds)
    report = verify(ds, progress=False)
    assert not report.ok and match.split(" ")[0].replace("\\", "") in \
        report.problems[0]["problem"]


def test_retired_only_in_a_version_4_manifest(replaced, tmp_path):
    ds = _write(tmp_path, replaced, lambda m: m.__setitem__("version", fmt.FORMAT_VERSION))
    with pytest.raises(fmt.FormatError, match="version 3 with a 'retired' list"):
        Dataset(ds)


def test_the_replaced_sample_keeps_its_index(replaced):
    ds = Dataset(replaced)
    ((old, new),) = ds.manifest[fmt.RETIRED_KEY]
    assert (len(ds), ds.manifest["num_samples"], new) == (12, 13, 12)
    assert [ds.record_of(i) for i in range(12)] == [new if r == old else r for r in range(12)]
    assert ds.locate(old) == ds.locate(-12 + old) == (len(ds.shards) - 1, 0)
    shard_ids, local, entries = ds.lookup(np.arange(12))
    assert (shard_ids[old], local[old]) == (len(ds.shards) - 1, 0)
    assert np.array_equal(ds.labels, entries["label"]) and len(ds.labels) == 12
    assert sum(ds.shard_sizes) == 12 and ds.shard_sizes[-1] == 0
    with pytest.raises(IndexError, match="sample 12 out of range for a data set of 12"):
        ds.lookup([12])
    mix = Mixture([ds, Dataset(replaced)])  # a Mixture reads its sets through lookup
    assert len(mix) == 24 and mix.shard_sizes == [ds.shard_sizes] * 2
    k, j, e = mix.lookup(np.arange(len(mix)))
    assert sorted(e["crc"].tolist()) == sorted(entries["crc"].tolist() * 2)
    assert len(np.unique(e["crc"])) == 12  # none retired: the old record's crc is not there
    retired_crc = np.concatenate([s.index["crc"] for s in ds.shards])[old]
    assert retired_crc not in e["crc"] and retired_crc not in entries["crc"]


@pytest.mark.parametrize("n,pairs,expected", [
    (6, [], None),
    (6, [[1, 5]], [0, 5, 2, 3, 4]),
    (7, [[1, 5], [5, 6]], [0, 6, 2, 3, 4]),              # a chain: its last record is shown
    (7, [[0, 4], [2, 5], [4, 6]], [6, 1, 5, 3]),
    (7, [[3, 4]], [0, 1, 2, 4, 5, 6]),
])
def test_sample_records(n, pairs, expected):
    got = fmt.sample_records(n, pairs)
    assert (got is None) if expected is None else got.tolist() == expected


@pytest.mark.parametrize("seed", range(20))
def test_sample_records_follows_a_model_of_appends(seed):
    """Appends that replace random samples (again and again) and add new ones, in a
    random packing order: every sample keeps its slot and shows its latest record."""
    rng = np.random.default_rng(seed)
    slots = list(range(int(rng.integers(1, 30))))  # sample -> its record
    records, pairs = len(slots), []
    for _ in range(int(rng.integers(1, 6))):
        replaced = rng.choice(len(slots), size=int(rng.integers(0, len(slots) + 1)),
                              replace=False).tolist()
        events = replaced + [None] * int(rng.integers(0, 5))
        for slot in rng.permutation(len(events)).tolist():
            slot = events[slot]
            if slot is None:
                slots.append(records)
            else:
                pairs.append([slots[slot], records])
                slots[slot] = records
            records += 1
    manifest = {"version": fmt.RETIRING_VERSION, "num_samples": records,
                fmt.RETIRED_KEY: sorted(pairs)}
    if pairs:
        fmt.check_retired(manifest, "model")
    got = fmt.sample_records(records, sorted(pairs))
    assert (list(range(records)) if got is None else got.tolist()) == slots
