"""A Mixture's errors name the set at fault: the set that lacks a field a Loader asks for
(not set 0, which has it), the set whose schema differs; and an epoch too long for this
machine's memory is refused at construction, before anything of its length is allocated."""
from __future__ import annotations

import numpy as np
import pytest

from dlpack_io.reader import Output
from dlpack_io.packer import Writer
from dlpack_io.reader import Dataset, Loader, Mixture


def _pack(dst, n, **fields):
    with Writer(dst, mode="raw", classes=["a"]) as w:
        for i in range(n):
            w.write(image=np.full((8, 8, 3), i, np.uint8), label=0,
                    **{k: v(i) for k, v in fields.items()})
    return Dataset(dst)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixerr")
    return (_pack(root / "txt", 6, txt=str), _pack(root / "plain", 5),
            _pack(root / "int", 4, txt=int))


def test_the_set_without_the_field_is_named(sets):
    txt, plain, _ = sets
    with pytest.raises(ValueError) as err:
        Loader(Mixture([txt, plain]), batch_size=2, fields=("image", "txt"))
    message = str(err.value)
    assert message.startswith("Mixture set 1: ") and str(plain.path) in message
    assert "'txt'" in message and "set 0 stores" not in message
    with pytest.raises(ValueError, match=r"^Mixture set 0: .*plain.*'txt'"):
        Loader(Mixture([plain, txt]), batch_size=2, fields=("image", "txt"))


def test_the_set_with_another_schema_is_named(sets):
    txt, _, other = sets
    with pytest.raises(ValueError, match=r"^Mixture set 1 \(.*int\): field 'txt' is "
                                         r"\{'type': 'int'\}, set 0 stores it as "
                                         r"\{'type': 'str'\}"):
        Loader(Mixture([txt, other]), batch_size=2, fields=("image", "txt"))


@pytest.mark.parametrize("n", [10**12, 2**40, "just above"])
def test_an_epoch_beyond_memory_is_refused_before_allocating(sets, n):
    if n == "just above":
        from dlpack_io.reader.mixture import ORDER_BYTES_PER_SAMPLE, memory_bytes
        n = memory_bytes() // ORDER_BYTES_PER_SAMPLE + 1
    with pytest.raises(ValueError, match=r"samples_per_epoch") as err:
        Mixture(list(sets[:2]), samples_per_epoch=n)
    assert f"{n} samples per epoch" in str(err.value) and "GiB" in str(err.value)


def test_an_epoch_that_fits_is_read(sets):
    mix = Mixture(list(sets[:2]), samples_per_epoch=40)
    assert len(mix) == 40 and sum(len(i) for _, _, i in
                                  Loader(mix, batch_size=8, output=Output(return_index=True))) == 40
