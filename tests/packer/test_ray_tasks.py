"""The Ray engine's parts that need no cluster: the shared cut rule, the task bodies,
the engine choice and the message when Ray is missing."""
import os
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from dlpack_io.packer import convert, engines
from dlpack_io.packer.packing import ShardCutter
from dlpack_io.packer.records import ConversionError
from dlpack_io.packer.writers import open_writer
from dlpack_io.reader.shard import RecordShard


def _cut(data_format, shard_size, lengths):
    cutter, shards = ShardCutter(data_format, shard_size), []
    for n in lengths:
        if cutter.starts_new_shard(n) or not shards:
            shards.append([])
        shards[-1].append(n)
    return shards


def test_cut_rule_pinned_for_both_formats():
    lengths = [100, 36, 64, 1, 200, 300]
    # record: each record takes its length rounded up to 64 bytes; the first record of a
    # shard always fits, however large.
    assert _cut("record", 200, lengths) == [[100, 36], [64, 1], [200], [300]]
    assert _cut("lmdb", 200, lengths) == [[100, 36, 64], [1], [200], [300]]


@pytest.mark.parametrize("data_format", ["record", "lmdb"])
def test_cutter_accounts_exactly_like_the_writer(tmp_path, data_format):
    """The rule's byte count is the writer's: the two can never disagree on a cut."""
    rng = np.random.default_rng(0)
    cutter = ShardCutter(data_format, 10**9)
    writer = open_writer(data_format, tmp_path, 0, 0, 10**9)
    from dlpack_io.packer.records import EncodedRecord

    for n in rng.integers(1, 5000, size=50):
        cutter.starts_new_shard(int(n))
        writer.add(EncodedRecord(b"x" * int(n), 1, 1, 0), 0, "p")
        assert cutter.data_size == writer.data_size
    writer.abort()


def test_segment_size_balances_bounds_the_driver_and_spans_few_shards():
    from dlpack_io.packer.engines import segment_size

    mb = 10**6
    assert segment_size(3000, 2, 256 * mb, 110e3) == 64         # at most 64 on a small cluster
    assert segment_size(1000, 2, 256 * mb, 110e3) == 64
    assert segment_size(200, 2, 256 * mb, 110e3) == 25          # 4 tasks per CPU
    assert segment_size(10**8, 1024, 256 * mb, 110e3) == 581    # 1/4 of a shard
    assert segment_size(10**8, 200, 256 * mb, 110e3) == 400     # 2 per CPU
    assert segment_size(360, 2, 60e3, 10e3) == 8                # tiny shards: the floor


def _items(image_folder):
    paths = sorted(image_folder.rglob("*.jpg"))[:5]
    return [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths]


OPTIONS = {"mode": "jpeg", "size": None, "max_side": None, "quality": 95, "validate": True,
           "restarts": False}


def test_encode_segment_concatenates_payloads_and_keeps_rejects(image_folder, tmp_path):
    items = _items(image_folder)
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"")
    items.insert(2, (str(bad), 0, bad.stat().st_mtime_ns))
    outcomes, payloads = engines.encode_segment(items, OPTIONS)
    assert outcomes[2] == ("reject", "empty file (0 bytes)")
    kept = [o for o in outcomes if o[0] == "ok"]
    assert len(kept) == 5 and payloads.dtype == np.uint8
    assert sum(o[2] for o in kept) == len(payloads)
    for (path, _, _), o in zip(items[:2] + items[3:], kept):
        _, offset, length = o[:3]
        assert payloads[offset:offset + length].tobytes() == open(path, "rb").read()


def test_assemble_shard_writes_what_the_local_writer_writes(image_folder, tmp_path):
    outcomes, payloads = engines.encode_segment(_items(image_folder), OPTIONS)
    # outcome: ok, offset, length, crc, height, width, kind, orientation, colour, ...
    items = [(0, o[1], o[2], k % 3, f"c/{k}.jpg", o[3], o[4], o[5], o[6], o[7], o[8])
             for k, o in enumerate(outcomes)]
    (tmp_path / ".shard-00004.rec.partial").write_bytes(b"left by a killed attempt")
    entry = engines.assemble_shard(str(tmp_path), "record", 4, 40, 10**6, items, payloads)
    assert entry["name"] == "shard-00004.rec" and entry["num_samples"] == 5
    assert sorted(os.listdir(tmp_path)) == ["shard-00004.rec"]
    shard = RecordShard(str(tmp_path / "shard-00004.rec"))
    assert list(shard.index["label"]) == [0, 1, 2, 0, 1]
    assert bytes(shard.payload(3)) == payloads[outcomes[3][1]:][:outcomes[3][2]].tobytes()


def test_assemble_shard_failure_leaves_no_temp_file(image_folder, tmp_path):
    outcomes, payloads = engines.encode_segment(_items(image_folder), OPTIONS)
    items = [(0, o[1], o[2], 0, "p", o[3], o[4], o[5], o[6], o[7], o[8]) for o in outcomes]
    items.append((1, 0, 10, 0, "p", 0, 1, 1, 0, 1, 0))  # a payload array that was not passed
    with pytest.raises(IndexError, match="list index out of range"):
        engines.assemble_shard(str(tmp_path), "record", 0, 0, 10**6, items, payloads)
    assert os.listdir(tmp_path) == []


def test_missing_ray_is_one_clear_message(image_folder, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets without Ray
    with pytest.raises(ConversionError, match=r"needs Ray.*pip install 'dlpack-io\[ray\]'"):
        convert(image_folder, tmp_path / "ds", engine="ray", progress=False)
    assert not (tmp_path / "ds").exists()  # nothing touched before the check


def test_engine_choice_is_validated(image_folder, tmp_path):
    with pytest.raises(ValueError, match="engine 'spark': expected one of"):
        convert(image_folder, tmp_path / "ds", engine="spark", progress=False)
    with pytest.raises(ValueError, match="--ray-address is for --engine ray"):
        convert(image_folder, tmp_path / "ds", ray_address="127.0.0.1:6379", progress=False)


def test_cli_help_describes_the_engine_options():
    from dlpack_io.tools.cli import main

    out = " ".join(CliRunner().invoke(main, ["convert", "--help"]).output.split())
    assert "--engine [local|ray]" in out and "--ray-address ADDRESS" in out
    assert "io[ray]" in out and "shared file system" in out  # (click wraps at the hyphen)
