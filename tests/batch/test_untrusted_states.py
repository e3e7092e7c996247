"""Resume states and Loader arguments from the wild (issue 26, kind 5): a state that is not
one of ours is a ValueError naming the key, found at once (nothing sized by a value in it);
arguments at extremes are refused or clamped before anything large is allocated."""
from __future__ import annotations

import copy
import time

import numpy as np
import pytest

from dlpack_io.reader import Dataset, Loader, Output, Workers
from dlpack_io.reader.batch import resume

from helpers import pack_jpeg_and_raw


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return pack_jpeg_and_raw(tmp_path_factory.mktemp("states"), 20, 2, seed=3, shard_size="60KB")


@pytest.fixture(scope="module")
def saved(packed):
    """(dataset, a real state after 2 of 7 batches of 3)."""
    ds = Dataset(packed["raw"])
    loader = Loader(ds, batch_size=3, num_workers=0)
    for k, _ in enumerate(loader):
        if k == 1:
            break
    return ds, loader.state_dict()


def _edited(state, path, value):
    out = copy.deepcopy(state)
    target = out
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


BAD = [
    (("epoch",), -1, r"'epoch' is -1, expected an integer in \[0, "),
    (("epoch",), 10**30, r"'epoch' is 10{30}"),
    (("epoch",), "3", r"'epoch' is '3' \(str\)"),
    (("epoch",), 2.0, r"'epoch' is 2.0 \(float\)"),
    (("epoch",), KeyError, r"key 'epoch' is missing"),
    (("version",), True, r"'version' is True \(bool\)"),
    (("version",), 99, r"'version' is 99"),
    (("segments",), {"a": 1}, r"'segments' is \{'a': 1\}, expected a list"),
    (("segments",), [0] * 10**6, r"'segments' has 1000000 entries"),
    (("segments", 0), "x", r"segments\[0\] is 'x', expected a mapping"),
    (("segments", 0, "world_size"), 10**12, r"segments\[0\]: 'world_size' is 10{12}"),
    (("segments", 0, "world_size"), 0, r"segments\[0\]: 'world_size' is 0"),
    (("segments", 0, "world_size"), None, r"segments\[0\]: 'world_size' is None"),
    (("segments", 0, "batch_size"), 10**15, r"segments\[0\]: 'batch_size' is 10{15}"),
    (("segments", 0, "batches"), -5, r"segments\[0\]: 'batches' is -5"),
    (("segments", 0, "batches"), 8, r"segments\[0\]: 'batches' is 8, expected an integer "
                                    r"in \[0, 7\]"),
    (("segments", 0, "batches"), 2**70, r"segments\[0\]: 'batches' is 1180591620717411303424"),
    (("epoch",), 10**5000, r"'epoch' is an integer of 16610 bits"),
    (("epoch",), np.int64(-3), r"'epoch' is -3, expected"),
    (("segments", 0, "drop_last"), "no", r"segments\[0\]: 'drop_last' is 'no', expected true"),
    (("segments", 0, "drop_last"), KeyError, r"segments\[0\]: key 'drop_last' is missing"),
    (("num_samples",), 10**9, r"does not match this loader .*'num_samples': \(1000000000, 20\)"),
]


@pytest.mark.parametrize("path,value,message", BAD,
                         ids=[f"{'.'.join(map(str, p))}-{i}" for i, (p, _, _) in enumerate(BAD)])
def test_a_state_not_ours_names_the_key_at_once(saved, path, value, message):
    ds, state = saved
    loader = Loader(ds, batch_size=3, num_workers=0)
    bad = _edited(state, path, value)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=message):
        loader.load_state_dict(bad)
    assert time.monotonic() - t0 < 0.5  # checks per key, never a loop sized by a value


@pytest.mark.parametrize("state", [None, [1, 2], "state", 3])
def test_a_state_that_is_not_a_dict_is_refused(saved, state):
    loader = Loader(saved[0], batch_size=3, num_workers=0)
    with pytest.raises(ValueError, match="loader state is a .*, expected the dict"):
        loader.load_state_dict(state)


def test_a_real_state_still_resumes_exactly(saved):
    ds, state = saved
    assert state["segments"] == [{"world_size": 1, "batch_size": 3, "drop_last": False,
                                  "batches": 2}]
    loader = Loader(ds, batch_size=3, num_workers=0, output=Output(return_index=True))
    loader.load_state_dict(state)
    rest = np.concatenate([b[2] for b in loader])
    full = Loader(ds, batch_size=3, num_workers=0, output=Output(return_index=True))
    everything = np.concatenate([b[2] for b in full])
    assert np.array_equal(rest, everything[6:])
    v1 = {"version": 1, "epoch": 0, "world_size": 1, "batch_size": 3, "drop_last": False,
          "batch": 2, **{k: state[k] for k in resume.ORDER_KEYS}}
    assert resume.parse_state(v1, {k: state[k] for k in resume.ORDER_KEYS}) == \
        (0, [resume.Segment(1, 3, False, 2)])


def test_extreme_loader_arguments_are_refused_or_clamped(packed):
    ds = Dataset(packed["raw"])
    with pytest.raises(ValueError, match=r"prefetch 1000000000: expected 1 to 4096 batches"):
        Loader(ds, batch_size=3, workers=Workers(prefetch=10**9))
    with pytest.raises(ValueError, match=r"num_workers 100000: expected at most 1024"):
        Loader(ds, batch_size=3, num_workers=100_000)
    # a batch far beyond the data set: the slots are sized by the data set (20 samples)
    loader = Loader(ds, batch_size=10**12, num_workers=2, workers=Workers(kind="process"),
                    output=Output(return_index=True))
    batches = [b[2] for b in loader]
    assert len(batches) == 1 and sorted(batches[0].tolist()) == list(range(20))


def test_process_slots_larger_than_memory_are_refused_before_mapping():
    from dlpack_io.reader.batch.loader import check_slots
    from dlpack_io.reader.batch.options import LoaderOptions

    o = LoaderOptions(batch_size=10**9, workers=Workers(kind="process"))
    with pytest.raises(ValueError, match=r"batch_size 1000000000 with worker kind 'process' "
                                         r"needs 5 shared batch slots of 1125899906842624 bytes"):
        check_slots(o, 2**50, 5)
    check_slots(o, 1024, 5)  # small slots pass
