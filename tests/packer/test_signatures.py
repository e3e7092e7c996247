"""convert() and Writer() spell out every option (no ``**options``): a user's editor and
``help()`` show them, a misspelt keyword is a TypeError naming it, and every packing option
of PackOptions reaches both (those that mean something for samples from code)."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

import dlpack_io.packer as packer
from dlpack_io.packer.options import PackOptions
from dlpack_io.packer.writer import _ENCODE_KEYS

PACKING = {f.name for f in dataclasses.fields(PackOptions)}


def _keywords(fn) -> dict:
    params = inspect.signature(fn).parameters
    assert all(p.kind is not p.VAR_KEYWORD for p in params.values()), f"{fn} takes **kwargs"
    return {n: p for n, p in params.items() if p.kind is p.KEYWORD_ONLY}


def test_convert_names_every_packing_option_and_leaves_their_defaults_to_packoptions():
    keywords = _keywords(packer.convert)
    assert PACKING <= set(keywords), sorted(PACKING - set(keywords))
    assert {n for n in PACKING if keywords[n].default is not None} == set()


def test_writer_names_the_options_a_sample_from_code_uses():
    keywords = _keywords(packer.Writer.__init__)
    assert set(_ENCODE_KEYS) | {"format", "shard_size", "jpeg_restarts"} <= set(keywords)
    assert {"classes", "provenance", "append"} <= set(keywords)


def test_the_package_hands_out_the_real_functions():
    from dlpack_io.packer.conversion import convert
    from dlpack_io.packer.records import ConversionError
    from dlpack_io.packer.writer import Writer
    assert (packer.convert, packer.Writer, packer.ConversionError) == \
        (convert, Writer, ConversionError)
    assert {"convert", "Writer", "ConversionError"} <= set(dir(packer))


def test_a_misspelt_option_is_a_typeerror_naming_it(tmp_path):
    with pytest.raises(TypeError, match="shard_sise"):
        packer.convert(tmp_path, tmp_path / "ds", shard_sise="1MB")
    with pytest.raises(TypeError, match="qualty"):
        packer.Writer(tmp_path / "w", qualty=90)
    with pytest.raises(ValueError, match="append"):
        packer.convert(tmp_path, tmp_path / "ds", replace_changed=True)


@pytest.mark.parametrize("append", [False, True])
@pytest.mark.parametrize("option", [{"storage_options": {"region": "x"}}, {"staging": "/tmp/x"}])
def test_object_storage_options_with_a_local_dst_are_refused_by_name(tmp_path, option, append):
    with pytest.raises(ValueError, match=r"ds: storage_options and staging .* are for s3://"):
        packer.convert(tmp_path, tmp_path / "ds", append=append, **option)
