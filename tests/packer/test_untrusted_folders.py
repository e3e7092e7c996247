"""Folders from strangers (issue 16 items 8-10, issue 13 items 3-4): conversions run as
the `dlpack` command in a child process under an address-space limit and a deadline. What may happen: a clear error
before any work, or a data set holding each real image once; never a write outside DST,
a hang, or an exponential scan."""
import json
import os
import platform
import resource
import subprocess
import sys

import numpy as np
import pytest

from dlpack_io.reader import Dataset, Loader, RandomResizedCrop
from dlpack_io.tools.synth import make_image_folder
from dlpack_io.tools.verification import verify

DEADLINE = 120  # a hang guard; every run here takes a few seconds
ADDRESS_SPACE = 3 * 2**30  # RLIMIT_AS of the conversion and its workers


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _convert(src, dst, *extra, timeout=DEADLINE):
    return subprocess.run([sys.executable, "-m", "dlpack_io.tools.cli", "convert", str(src),
                           str(dst), "--workers", "1", *extra], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=_limit_memory)


@pytest.fixture
def src(tmp_path):
    """6 JPEGs in classes a and b."""
    make_image_folder(tmp_path / "src", 6, 2, seed=2, size=(24, 32))
    return tmp_path / "src"


def _class_dirs(src):
    return sorted(p for p in src.iterdir() if p.is_dir())


# ---- issue 16 item 8: nothing convert writes follows a symlink ------------------------

def test_lock_file_symlink_is_never_written_through(src, tmp_path):
    """Before: convert truncated the link's target and wrote its pid into it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    dst = tmp_path / "ds"
    dst.mkdir()
    (dst / ".dlpack-convert.lock").symlink_to(victim)
    done = _convert(src, dst, "--quiet")
    assert done.returncode == 1
    assert ".dlpack-convert.lock is a symbolic link" in done.stderr
    assert victim.read_text() == "precious\n"


def test_overwrite_replaces_planted_links_instead_of_writing_through_them(src, tmp_path):
    victims = []
    dst = tmp_path / "ds"
    dst.mkdir()
    for name in ("manifest.json", "rejects.tsv", "shard-00000.rec", ".shard-00000.rec.partial",
                 ".dlpack-convert.journal", ".dlpack-convert.journal.tmp"):
        victims.append(tmp_path / f"victim-{name}")
        victims[-1].write_text("precious\n")
        (dst / name).symlink_to(victims[-1])
    done = _convert(src, dst, "--quiet", "--overwrite")
    assert done.returncode == 0, done.stderr
    assert all(v.read_text() == "precious\n" for v in victims)
    assert not any(os.path.islink(dst / n) for n in os.listdir(dst))
    assert verify(dst, progress=False).ok


# ---- issue 16 item 9: symlink loops and farms ------------------------------------------

def test_symlink_loops_are_walked_once(src, tmp_path):
    """Before: one loop packed the same image 41 times, three kept the scan going for
    minutes (it grows exponentially)."""
    a, b = _class_dirs(src)
    (a / "sub").mkdir()
    (a / "sub" / "loop-to-class").symlink_to(a)
    (a / "loop-to-src").symlink_to(src)
    (b / "loop-to-other-class").symlink_to(a)
    (b / "sub").mkdir()
    (b / "sub" / "loop-to-parent").symlink_to(b / "sub")
    dst = tmp_path / "ds"
    done = _convert(src, dst, "--quiet", timeout=60)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["num_samples"] == 6 and manifest["class_counts"] == [3, 3]
    assert "4 folders reached again (a loop or an alias) and skipped" in done.stdout


def test_symlink_farm_is_followed_and_counted(tmp_path):
    """An ImageNet subset made of links: legitimate; links leaving SRC are followed and
    counted in the summary (docs/reliability.md)."""
    make_image_folder(tmp_path / "store", 6, 2, seed=3, size=(24, 32))
    farm = tmp_path / "farm"
    for cls in _class_dirs(tmp_path / "store"):
        (farm / cls.name).mkdir(parents=True)
        for img in sorted(cls.iterdir()):
            (farm / cls.name / img.name).symlink_to(img)
    (farm / "linked-class").symlink_to(_class_dirs(tmp_path / "store")[0])
    done = _convert(farm, tmp_path / "ds", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "symlinks: 9 inputs reached through a link, 9 of them outside SRC" in done.stdout
    assert Dataset(tmp_path / "ds").manifest["class_counts"] == [3, 3, 3]


# ---- issue 16 item 10: provenance ------------------------------------------------------

def test_provenance_is_recorded_by_default_and_can_be_left_out(src, tmp_path):
    host = platform.node()
    assert _convert(src, tmp_path / "plain", "--quiet").returncode == 0
    plain = (tmp_path / "plain" / "manifest.json").read_text()
    assert str(src) in plain and json.loads(plain)["created"]["host"] == host
    done = _convert(src, tmp_path / "shared", "--quiet", "--no-provenance")
    assert done.returncode == 0, done.stderr
    shared = (tmp_path / "shared" / "manifest.json").read_text()
    assert str(src) not in shared and str(tmp_path) not in shared
    manifest = json.loads(shared)
    assert manifest["source"]["root"] is None and "host" not in manifest["created"]
    assert verify(tmp_path / "shared", progress=False).ok


# ---- issue 13 item 3: DST and SRC must not nest; empty classes are said loudly ---------

@pytest.mark.parametrize("where", ["inside-src", "class-folder", "same", "src-inside-dst"])
def test_dst_and_src_must_not_nest(src, tmp_path, where):
    """Before: accepted; the next conversion of SRC found an extra class."""
    dst = {"inside-src": src / "sub", "class-folder": _class_dirs(src)[0], "same": src,
           "src-inside-dst": tmp_path}[where]
    before = sorted(str(p) for p in src.rglob("*"))
    done = _convert(src, dst, "--quiet", "--overwrite")
    assert done.returncode == 1
    assert "choose a DST outside SRC" in done.stderr
    assert sorted(str(p) for p in src.rglob("*")) == before  # nothing written, nothing removed


def test_a_class_folder_without_usable_images_is_said_loudly(src, tmp_path):
    """Before: 20 PNGs made an empty class silently (PNGs are now packed by default, see
    --non-jpeg: a folder of them is empty only when they are rejected)."""
    from PIL import Image

    (src / "notes").mkdir()
    for i in range(3):
        (src / "notes" / f"{i}.txt").write_text("not an image")
    (src / "pngs").mkdir()
    for i in range(2):
        Image.new("RGB", (8, 8)).save(src / "pngs" / f"{i}.png")
    done = _convert(src, tmp_path / "ds", "--quiet", "--non-jpeg", "reject")
    assert done.returncode == 3, done.stderr  # complete, with rejects above --max-rejects 0
    assert "class folder" in done.stderr and "notes has no usable image (3 other files" in done.stderr
    assert "WARNING: 2 classes with no packed image: notes, pngs" in done.stderr


# ---- issue 13 item 4: a folder of images without classes -------------------------------

def test_flat_folder_needs_the_flag_and_then_packs_with_label_minus_one(tmp_path):
    """Before: refused, without saying how to pack such a folder."""
    make_image_folder(tmp_path / "nested", 5, 1, seed=6, size=(24, 32))
    flat = tmp_path / "flat"
    flat.mkdir()
    for i, img in enumerate(sorted((tmp_path / "nested").rglob("*.jpg"))):
        img.rename(flat / f"{i}.jpg")
    refused = _convert(flat, tmp_path / "no", "--quiet")
    assert refused.returncode == 1
    assert "found 5 image files directly in" in refused.stderr and "--no-labels" in refused.stderr
    (flat / "deeper").mkdir()  # --no-labels takes images at any depth
    (flat / "4.jpg").rename(flat / "deeper" / "4.jpg")
    done = _convert(flat, tmp_path / "ds", "--quiet", "--no-labels")
    assert done.returncode == 0, done.stderr
    ds = Dataset(tmp_path / "ds")
    assert ds.classes == [] and len(ds) == 5
    assert {ds[i][1] for i in range(len(ds))} == {-1}
    assert verify(tmp_path / "ds", decode=True, progress=False).ok
    loader = Loader(ds, batch_size=2, num_workers=0, transforms=[RandomResizedCrop(8)])
    labels = np.concatenate([lab.numpy() for _, lab in loader])
    assert labels.tolist() == [-1] * 5
    inspect = subprocess.run([sys.executable, "-m", "dlpack_io.tools.cli", "inspect",
                              str(tmp_path / "ds")], capture_output=True, text=True, timeout=60)
    assert inspect.returncode == 0 and "packed with --no-labels: every label is -1" in inspect.stdout


# ---- files that are not files in SRC ------------------------------------------------------

def test_a_fifo_named_like_an_image_never_blocks_the_packer(src, tmp_path):
    os.mkfifo(_class_dirs(src)[0] / "pipe.jpg")
    done = _convert(src, tmp_path / "ds", "--quiet", timeout=60)
    assert done.returncode == 0, done.stderr
    assert Dataset(tmp_path / "ds").manifest["num_samples"] == 6
    listed = tmp_path / "list.csv"
    listed.write_text("path,label\n" + "".join(f"{p.relative_to(src)},x\n" for p in
                                               sorted(src.rglob("*.jpg"))))
    done = _convert(src, tmp_path / "ds2", "--quiet", "--list", str(listed), timeout=60)
    assert done.returncode == 3, done.stderr  # the FIFO is a reject (--max-rejects 0)
    rejects = (tmp_path / "ds2" / "rejects.tsv").read_text()
    assert "pipe.jpg\tnot a regular file" in rejects
