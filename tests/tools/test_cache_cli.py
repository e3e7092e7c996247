"""``dlpack cache ls|du|clear`` over a cache filled by a real remote data set (SeaweedFS),
with a real process holding it open while ``clear`` runs."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from dlpack_io.reader.dataset import Dataset
from dlpack_io.tools.cli import main
from dlpack_io.tools.synth import make_image_folder

from helpers import upload_folder, wait_until

URL = "s3://dlpack-test/cachecli/base"

HOLDER = """
import os, sys
from dlpack_io.reader.dataset import Dataset
ds = Dataset(sys.argv[1], cache_dir=sys.argv[2])
open(sys.argv[3], "w").close()           # event: the data set is open
sys.stdin.read()                          # event: the test closes our stdin
"""


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    from dlpack_io.packer import convert

    root = tmp_path_factory.mktemp("cachecli")
    make_image_folder(root / "src", 12, 2, seed=4, size=(32, 40))
    convert(root / "src", root / "local", shard_size="20KB", workers=1, progress=False)
    upload_folder(root / "local", URL, s3_server.env())


def _cli(*args):
    result = CliRunner().invoke(main, ["cache", *args])
    return result.exit_code, result.output


def _bytes(folder) -> int:
    return sum(os.lstat(os.path.join(d, f)).st_size for d, _, fs in os.walk(folder) for f in fs)


def _fill(cache) -> tuple[str, int]:
    ds = Dataset(URL, cache_dir=cache)
    prefetch = ds.start_prefetch([np.arange(12)], mode="records")
    prefetch.wait(0, timeout=60)
    prefetch.close()
    key = ds._remote.key
    ds._remote.close()
    return key, _bytes(cache / key)


def test_ls_du_clear_exact_outputs(s3_env, packed, tmp_path, monkeypatch):
    cache = tmp_path / "c"
    assert _cli("ls", "--cache-dir", str(cache)) == (0, f"no data sets cached in {cache}\n")
    key, size = _fill(cache)
    line = f"{key}  {size:>15,} bytes  {12:>9,} records  {0:>5,} shards  idle    {URL}\n"
    assert _cli("ls", "--cache-dir", str(cache)) == (0, line)
    assert _cli("du", "--cache-dir", str(cache)) == (
        0, f"{size:>15,}  {key}  {URL}\n{size:>15,}  total in {cache}\n")
    monkeypatch.setenv("DLPACK_CACHE_DIR", str(cache))  # the default folder
    assert _cli("clear", "ds-00000000-0000000000000000") == (
        1, f"freed 0 bytes in {cache}\ndlpack: error: not cached in {cache}: "
           f"ds-00000000-0000000000000000 (see 'dlpack cache ls')\n")
    assert os.path.isdir(cache / key)
    assert _cli("clear") == (0, f"removed {key}  {size:,} bytes  {URL}\n"
                                f"freed {size:,} bytes in {cache}\n")
    assert os.listdir(cache) == []


def test_clear_leaves_a_data_set_that_a_running_process_has_open(s3_env, packed, tmp_path):
    cache = tmp_path / "c"
    key, size = _fill(cache)
    (cache / "planted").mkdir()  # not a name dlpack gives: never touched
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, URL, str(cache), str(ready)],
                              stdin=subprocess.PIPE, text=True)
    try:
        wait_until(ready.exists, deadline=60, what="the holder to open the data set")
        assert _cli("clear", "--cache-dir", str(cache)) == (
            0, f"left {key}: in use by a running process (close it, then clear again)\n"
               f"freed 0 bytes in {cache}\n")
        assert _cli("clear", "--cache-dir", str(cache), key) == (  # asked by name: exit 1
            1, f"left {key}: in use by a running process (close it, then clear again)\n"
               f"freed 0 bytes in {cache}\ndlpack: error: not removed, in use: {key}\n")
        assert _bytes(cache / key) >= size  # every kept record is still there
        assert "in use" in _cli("ls", "--cache-dir", str(cache))[1]
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0
    code, out = _cli("clear", "--cache-dir", str(cache))
    assert code == 0 and out.startswith(f"removed {key}  ")
    assert sorted(os.listdir(cache)) == ["planted"]


def test_ls_prints_a_planted_url_as_one_printable_line(tmp_path):
    """source.url is read from the untrusted cache folder: a newline or an escape sequence
    in it is shown escaped, never forging a line of output or driving the terminal."""
    key = "ds-00000000-0000000000000000"
    os.makedirs(tmp_path / key, mode=0o700)
    (tmp_path / key / "source.url").write_bytes(
        b"s3://b/p\nds-11111111-1111111111111111  0 bytes  idle  s3://x\x1b[2J")
    code, out = _cli("ls", "--cache-dir", str(tmp_path))
    assert code == 0 and out.count("\n") == 1 and "\x1b" not in out
    assert out.endswith("s3://b/p\\nds-11111111-1111111111111111  0 bytes  idle  "
                        "s3://x\\x1b[2J\n")
