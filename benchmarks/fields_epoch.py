"""What fields cost a Loader epoch (issue 24): a classification epoch with the default
fields against another install (main before fields), and an image + caption epoch against
the image-only epoch of the same data set.

    python -m benchmarks.fields_epoch make --root /tmp/fb --images 3000
    python -m benchmarks.fields_epoch run --root /tmp/fb [--before-python PY --before-path P]
    python -m benchmarks.fields_epoch paired --root /tmp/fb --repeats 8

``make`` writes ``--images`` photo-like JPEGs (tools/synth.py, ~375x500) with a ~60
character caption sidecar each, and packs them twice: ``plain`` (``--fields none``: format
2, what main reads) and ``captions`` (format 3, field ``txt``). ``run`` times, in fresh
processes, interleaved round by round (medians of ``--repeats``): (a) ``plain`` with the
default fields by this checkout, (b) the same by the other install (PYTHONPATH
``--before-path``), (c) ``captions`` image-only, (d) ``captions`` with
``fields=("image", "txt")``. Each epoch: RandomResizedCrop(224) + flip on the host, batch
256, 2 thread workers, uint8 output. ``paired`` runs (c) and (d) in one process, epoch
after epoch (order alternating), and times the consumer's field step alone: on a machine
too busy for fresh-process epochs to agree, the ratio of neighbouring epochs and the cost
of the only work a caption adds are what can still be read.
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


def paired(path: str, pairs: int) -> dict:
    """Image + txt against image + label over the same data set, in one process: ``pairs``
    pairs of whole epochs back to back (which comes first alternates), so each ratio
    compares epochs seconds apart under the same load; and the consumer's field step alone
    (the Loader's field step, ``targets.Assembler``, for 256 random samples), the only work
    the caption adds."""
    import numpy as np

    from dlpack_io.reader import Dataset, Loader, RandomHorizontalFlip, RandomResizedCrop
    import torch

    from dlpack_io.reader.batch.fields import Assembler

    ds = Dataset(path)
    kw = dict(batch_size=256, num_workers=2, seed=0, drop_last=True,
              transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])
    loaders = {"label": Loader(ds, **kw), "txt": Loader(ds, fields=("image", "txt"), **kw)}

    def one(name):
        start, n = time.perf_counter(), 0
        for batch in loaders[name]:
            n += len(batch[0])
        return n / (time.perf_counter() - start)

    rates = {"label": [], "txt": []}
    for k in range(pairs):
        for name in (("label", "txt") if k % 2 == 0 else ("txt", "label")):
            rates[name].append(one(name))
    txt = loaders["txt"]
    assemble = Assembler(ds, ("image", "txt"), txt.spec, txt.options, on_device=False)
    images, labels = torch.zeros(256, 3, 1, 1), torch.zeros(256, dtype=torch.int64)
    rng, step = np.random.default_rng(0), []
    for _ in range(30):
        idx = rng.choice(len(ds), 256, replace=False)
        t0 = time.perf_counter()
        assemble(images, labels, idx, 0)
        step.append(time.perf_counter() - t0)
    ratios = [t / b for t, b in zip(rates["txt"], rates["label"])]
    return {"txt_over_label_median": statistics.median(ratios),
            "ratios": [round(r, 3) for r in ratios],
            "images_per_s": {k: [round(v) for v in vs] for k, vs in rates.items()},
            "field_step_ms": {"min": 1e3 * min(step), "median": 1e3 * statistics.median(step)}}


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
    p.add_argument("what", choices=["make", "run", "epoch", "paired"])
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
    elif a.what == "paired":
        sys.stdout.write(json.dumps(paired(os.path.join(a.root, "captions"), a.repeats),
                                    indent=1) + "\n")
    elif a.what == "epoch":
        sys.stdout.write(f"{epoch(a.path, a.fields)}\n")
    else:
        sys.stdout.write(json.dumps(run(a.root, a.repeats, a.before_python, a.before_path),
                                    indent=1) + "\n")


if __name__ == "__main__":
    main()
