"""What fields cost a Loader epoch (issue 24): a classification epoch with the default
fields against another install (main before fields), and an image + caption epoch against
the image-only epoch of the same data set.

    python -m benchmarks.fields_epoch make --root /tmp/fb --images 3000
    python -m benchmarks.fields_epoch run --root /tmp/fb [--before-python PY --before-path P]

``make`` writes ``--images`` photo-like JPEGs (tools/synth.py, ~375x500) with a ~60
character caption sidecar each, and packs them twice: ``plain`` (``--fields none``: format
2, what main reads) and ``captions`` (format 3, field ``txt``). ``run`` times, in fresh
processes, interleaved round by round (medians of ``--repeats``): (a) ``plain`` with the
default fields by this checkout, (b) the same by the other install (PYTHONPATH
``--before-path``), (c) ``captions`` image-only, (d) ``captions`` with
``fields=("image", "txt")``. Each epoch: RandomResizedCrop(224) + flip on the host, batch
256, 2 thread workers, uint8 output.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORDS = "a photo of the small red cat dog car tree house on in with near under big".split()


def make(root: str, images: int) -> None:
    """The source folder with caption sidecars, packed as ``plain`` and ``captions``."""
    import numpy as np

    from dlpack_io.packer import convert
    from dlpack_io.tools.synth import make_image_folder

    src = os.path.join(root, "src")
    rng = np.random.default_rng(0)
    for path in make_image_folder(src, images, 10):
        words = []
        while len(" ".join(words)) < 60:
            words.append(WORDS[rng.integers(len(WORDS))])
        path.with_suffix(".txt").write_text(" ".join(words)[:60])
    for name, fields in (("plain", "none"), ("captions", None)):
        convert(src, os.path.join(root, name), fields=fields, progress=False, overwrite=True)


def epoch(path: str, fields: str) -> float:
    """Images per second of one Loader epoch (after a warm-up batch) over ``path``."""
    from dlpack_io.reader import Dataset, Loader, RandomHorizontalFlip, RandomResizedCrop

    kw = {} if fields == "default" else {"fields": tuple(fields.split(","))}
    loader = Loader(Dataset(path), batch_size=256, num_workers=2, seed=0, drop_last=True,
                    transforms=[RandomResizedCrop(224), RandomHorizontalFlip()], **kw)
    it = iter(loader)
    next(it)
    start, n = time.perf_counter(), 0
    for batch in it:
        n += len(batch[0])
    return n / (time.perf_counter() - start)


def _child(python: str, env_path: str | None, path: str, fields: str) -> float:
    env = dict(os.environ)
    if env_path:
        env["PYTHONPATH"] = env_path
    out = subprocess.run([python, "-m", "benchmarks.fields_epoch", "epoch", "--path", path,
                          "--fields", fields], env=env, capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


def run(root: str, repeats: int, before_python: str | None, before_path: str | None) -> dict:
    """Interleaved medians of the four epochs in the module docstring."""
    me = sys.executable
    cases = {"plain, default fields (this checkout)": (me, None, "plain", "default"),
             "captions, image + label": (me, None, "captions", "default"),
             "captions, image + txt": (me, None, "captions", "image,txt")}
    if before_python:
        cases["plain, default fields (before)"] = (before_python, before_path, "plain", "default")
    times = {k: [] for k in cases}
    for _ in range(repeats):
        for name, (py, env_path, ds, fields) in cases.items():
            times[name].append(_child(py, env_path, os.path.join(root, ds), fields))
    return {k: {"median": statistics.median(v), "all": [round(x) for x in v]}
            for k, v in times.items()}


def main() -> None:
    """The command line above."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["make", "run", "epoch"])
    p.add_argument("--root", default="/tmp/fields-bench")
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--path")
    p.add_argument("--fields", default="default")
    p.add_argument("--before-python")
    p.add_argument("--before-path")
    a = p.parse_args()
    if a.what == "make":
        make(a.root, a.images)
    elif a.what == "epoch":
        sys.stdout.write(f"{epoch(a.path, a.fields)}\n")
    else:
        sys.stdout.write(json.dumps(run(a.root, a.repeats, a.before_python, a.before_path),
                                    indent=1) + "\n")


if __name__ == "__main__":
    main()
