"""What appending costs (issue 29): appending NEW images to a data set of BASE images
against converting those NEW images alone, in one run, interleaved, medians of repeats.

    python -m benchmarks.append --root /tmp/append-bench [--base 10000] [--new 1000] \
        [--repeats 3] [--workers 0] [--size 375x500]

Writes ``--base`` + ``--new`` synthetic ImageNet-like JPEGs (tools/synth.py; kept under
``--root`` for later runs), converts the first ``--base`` into a data set once, then per
round: (a) ``convert`` of the ``--new`` images alone into a fresh folder, (b) ``convert
--append`` of the whole source (base + new) onto a fresh copy of the data set (hard
links: shards are never written in place, so a linked copy is a true copy for an append).
(b) stats the base's files and hashes only those whose size or mtime differ from the data
set's input-stat record (none here: the sources are hard links of the packed files); (c)
is (b) with ``checksum=True`` (``--checksum``: hash every base file, as every append did
before the record). ``find_new`` / ``find_new_checksum`` time what (b) / (c) do before
packing (scan of SRC, shard metadata, stats, hashes) alone, in the same round. ``hash_cost``: the CPU
time per image of the SHA-256 that every conversion's workers now compute, against their
encode of the same files. Prints JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

from dlpack_io.packer import convert
from dlpack_io.tools.synth import make_image_folder


def _sources(root: str, base: int, new: int, size) -> tuple[str, str]:
    """(folder of base + new images, folder of the new images alone), made once."""
    everything, only_new = os.path.join(root, "src"), os.path.join(root, "new")
    if not os.path.isdir(everything):
        make_image_folder(everything, base, 100, seed=0, size=size)
        make_image_folder(only_new, new, 110, seed=1, size=size)  # 10 new classes too
        for cls in sorted(os.listdir(only_new)):
            os.makedirs(os.path.join(everything, cls), exist_ok=True)
            for name in os.listdir(os.path.join(only_new, cls)):
                os.link(os.path.join(only_new, cls, name),
                        os.path.join(everything, cls, f"new_{name}"))
    return everything, only_new


def _base_set(root: str, base: int, size, workers: int) -> tuple[str, float]:
    """The data set of the base images alone (a source holding only them, linked)."""
    src, dst = os.path.join(root, "base-src"), os.path.join(root, "base")
    if not os.path.isdir(src):
        for cls in sorted(os.listdir(os.path.join(root, "src"))):
            names = [n for n in os.listdir(os.path.join(root, "src", cls))
                     if not n.startswith("new_")]
            if names:
                os.makedirs(os.path.join(src, cls))
            for name in names:
                os.link(os.path.join(root, "src", cls, name), os.path.join(src, cls, name))
    start = time.perf_counter()
    convert(src, dst, workers=workers, progress=False, overwrite=True)
    return dst, time.perf_counter() - start


def _find_new(everything: str, base_dst: str, workers: int, checksum: bool) -> int:
    """What an append does before packing: scan SRC, read the shards' metadata, hash the
    files whose path is packed already (``checksum``; else only those whose size or mtime
    differ from the input-stat record). Returns the number of new inputs."""
    from dlpack_io.packer import appendbase
    from dlpack_io.packer.scan import scan_image_folder

    inputs = scan_image_folder(everything)
    base = appendbase.read_base(base_dst)
    known = appendbase.known_inputs(appendbase.shard_metas(base_dst, base["shards"]))
    threads = workers or len(os.sched_getaffinity(0))
    recorded = None if checksum else appendbase.read_local(base_dst, base)
    return len(appendbase.split_inputs(inputs.root, inputs.paths, known, threads,
                                       recorded).todo)


def _linked_copy(src: str, dst: str) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, copy_function=os.link)


def _round(root: str, base_dst: str, everything: str, only_new: str, workers: int) -> dict:
    fresh, grown = os.path.join(root, "fresh"), os.path.join(root, "grown")
    shutil.rmtree(fresh, ignore_errors=True)
    start = time.perf_counter()
    alone = convert(only_new, fresh, workers=workers, progress=False)
    t_alone = time.perf_counter() - start
    times = {"convert_new": t_alone}
    for name, checksum in (("append_new", False), ("append_checksum", True)):
        _linked_copy(base_dst, grown)
        start = time.perf_counter()
        appended = convert(everything, grown, append=True, checksum=checksum, workers=workers,
                           progress=False)
        times[name] = time.perf_counter() - start
        if appended["append"]["new_samples"] != alone["num_samples"]:
            raise SystemExit(f"append packed {appended['append']['new_samples']} images, the "
                             f"conversion of the new ones {alone['num_samples']}")
        times[name.replace("append", "hashed")] = appended["append"]["hashed"]
    for name, checksum in (("find_new", False), ("find_new_checksum", True)):
        start = time.perf_counter()  # of the append: finding what is new (scan + hashes)
        _find_new(everything, base_dst, workers, checksum)
        times[name] = time.perf_counter() - start
    return dict(times, duplicates=appended["append"]["duplicates"])


def hash_cost(folder: str, count: int = 500, repeats: int = 3) -> dict:
    """CPU time per image of the SHA-256 every conversion now computes in its workers,
    against the worker's encode of the same bytes (default options); medians."""
    import glob
    import hashlib

    from dlpack_io.packer.encode import encode_file
    from dlpack_io.packer.options import PackOptions
    from dlpack_io.packer.packing import encode_options

    datas = []
    for path in sorted(glob.glob(os.path.join(folder, "*", "*.jpg")))[:count]:
        with open(path, "rb") as f:
            datas.append(f.read())
    options = encode_options(PackOptions())
    hashed, encoded = [], []
    for _ in range(repeats):
        start = time.process_time()
        for data in datas:
            hashlib.sha256(data).hexdigest()
        hashed.append(time.process_time() - start)
        start = time.process_time()
        for data in datas:
            encode_file(data, **options)
        encoded.append(time.process_time() - start)
    h, e = statistics.median(hashed) / len(datas), statistics.median(encoded) / len(datas)
    return {"images": len(datas), "mean_bytes": sum(map(len, datas)) // len(datas),
            "sha256_ms": round(h * 1e3, 4), "encode_ms": round(e * 1e3, 4),
            "sha256_over_encode": round(h / e, 4)}


def main(argv=None) -> None:
    """Run the benchmark and print its JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--base", type=int, default=10_000)
    p.add_argument("--new", type=int, default=1_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--size", default="375x500", help="HxW of the synthetic images")
    a = p.parse_args(argv)
    size = tuple(int(x) for x in a.size.split("x"))
    everything, only_new = _sources(a.root, a.base, a.new, size)
    base_dst, t_base = _base_set(a.root, a.base, size, a.workers)
    rounds = [_round(a.root, base_dst, everything, only_new, a.workers)
              for _ in range(a.repeats)]
    med = {k: statistics.median(r[k] for r in rounds)
           for k in ("convert_new", "append_new", "append_checksum", "find_new",
                     "find_new_checksum")}
    print(json.dumps({"base": a.base, "new": a.new, "size": a.size, "workers": a.workers,
                      "cores": len(os.sched_getaffinity(0)), "convert_base_s": round(t_base, 2),
                      "rounds": rounds, "median_s": med,
                      "append_over_convert_new": round(med["append_new"] / med["convert_new"], 3),
                      "checksum_over_convert_new": round(med["append_checksum"]
                                                         / med["convert_new"], 3),
                      "append_over_convert_base": round(med["append_new"] / t_base, 3),
                      "hash_cost": hash_cost(only_new)},
                     indent=1))


if __name__ == "__main__":
    main()
