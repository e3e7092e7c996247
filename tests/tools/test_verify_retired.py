"""``dlpack verify`` of a data set with retired records (reader/format/schema.py): a
retired pair must name two records packed from the same source path (a replacement packs
the changed input again), else the sample would silently show another input's image."""
from __future__ import annotations

import json
import shutil

import pytest

from dlpack_io.reader import format as fmt
from dlpack_io.tools.verification import verify

from helpers import pack_with_one_replaced

OPTS = dict(shard_size="8KB", workers=1, progress=False, mode="raw", size=8)


@pytest.fixture(scope="module")
def replaced(tmp_path_factory):
    """12 records, then an append replacing one changed input: retired [[old, 12]]."""
    root = tmp_path_factory.mktemp("verify_retired")
    return pack_with_one_replaced(root, OPTS)


def test_the_union_of_a_replacing_append_verifies(replaced):
    report = verify(replaced, progress=False)
    assert report.ok, report.problems


def test_a_retired_pair_of_two_inputs_is_reported(replaced, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(replaced, ds)
    m = json.loads((ds / fmt.MANIFEST_NAME).read_bytes())
    ((old, new),) = m[fmt.RETIRED_KEY]
    m[fmt.RETIRED_KEY] = [[old - 1, new]]  # a well-formed pair naming another input's record
    m["checksum"] = fmt.manifest_checksum(m)
    (ds / fmt.MANIFEST_NAME).write_bytes(fmt.encode_meta(m))
    report = verify(ds, progress=False)
    ((problem),) = report.problems
    assert problem["where"] == str(ds / fmt.MANIFEST_NAME)
    assert problem["problem"].startswith(
        f"retired[0]: record {old - 1} (class_00/img_000004.jpg) is replaced by record "
        f"{new} (class_01/img_000003.jpg), packed from another input; ")
