"""URLs as users type them (reader/remote/clouds.py): one of ours mistyped, or without a
bucket, is refused with words that say what to write, by the Dataset, convert and the CLI,
before any request and never taken for a local folder name."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from dlpack_io.reader.dataset import Dataset
from dlpack_io.reader.remote.clouds import canonical, is_remote, parse_url
from dlpack_io.tools.cli import main


@pytest.mark.parametrize("url, meant", [("S3://bucket/data", "s3://bucket/data"),
                                        ("Gs://bucket/data", "gs://bucket/data"),
                                        ("AZ://container/x", "az://container/x"),
                                        ("s3:/bucket/data", "s3://bucket/data"),
                                        ("s3:bucket", "s3://bucket")])
def test_a_mistyped_url_of_ours_says_what_was_meant(url, meant, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    words = f"did you mean {meant}\\?.*s3://\\.\\.\\., gs://\\.\\.\\., az://\\.\\.\\."
    with pytest.raises(ValueError, match=words):
        is_remote(url)
    with pytest.raises(ValueError, match=words):
        Dataset(url, cache_dir=tmp_path / "cache")
    for command in (["inspect", url], ["verify", url]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2 and f"did you mean {meant}?" in result.output
    (tmp_path / "src").mkdir()
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "src"), url])
    assert result.exit_code == 1 and f"did you mean {meant}?" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no folder named s3:...


@pytest.mark.parametrize("url, what", [("gs://", "no GCS bucket name; write gs://bucket/"),
                                       ("s3://", "no S3 bucket name; write s3://bucket/"),
                                       ("az:///x", "no Azure container name; write "
                                                   "az://container/"),
                                       ("s3:///", "no S3 bucket name")])
def test_a_url_without_a_bucket_says_so(url, what, tmp_path):
    with pytest.raises(ValueError, match=what):
        parse_url(url)
    with pytest.raises(ValueError, match=what):
        Dataset(url, cache_dir=tmp_path / "cache")
    result = CliRunner().invoke(main, ["inspect", url])
    assert result.exit_code == 1 and f"{url}: {what}" in result.output


def test_canonical():
    assert canonical("s3://bucket/a/b/") == "s3://bucket/a/b"
    assert canonical("gs://bucket") == canonical("gs://bucket/") == "gs://bucket"
    assert not is_remote("./S3:/x") and not is_remote("/data/s3:/x")


def test_a_url_passed_as_a_path_says_to_pass_a_str(tmp_path):
    """pathlib.Path("s3://b/p") is the folder "s3:/b/p": refused naming the URL meant."""
    from pathlib import Path

    with pytest.raises(ValueError, match=r"did you mean s3://bucket/data\? .*pass the URL as "
                                         r"a str"):
        Dataset(Path("s3://bucket/data"), cache_dir=tmp_path / "cache")
    assert not is_remote(Path("/data/s3:/x")) and not is_remote(tmp_path)


@pytest.mark.parametrize("url", ["s3://bucket/data ", "s3://bucket/data\n", "gs://b\tx/y "])
def test_white_space_around_a_url_is_named(url, tmp_path):
    with pytest.raises(ValueError, match="white space around the URL; pass"):
        Dataset(url, cache_dir=tmp_path / "cache")
