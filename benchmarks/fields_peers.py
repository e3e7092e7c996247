"""Image + caption against the peers (issue 24): the same image-text set packed by us, by
WebDataset and by MosaicML Streaming; conversion time and epoch images/s, image + caption.

    python -m benchmarks.fields_epoch make --root /tmp/fb --images 3000   # JPEGs + .txt
    PYTHONPATH=PEERS python -m benchmarks.fields_peers --src /tmp/fb/src --rounds 3

Contenders: the registry's "fields" section (tools/bench/families.py; ``--only`` picks
some). Each converts the folder (a JPEG and a ~60-character caption per sample) into its
own format, timed; then an epoch in a fresh process: decode -> RandomResizedCrop(224) -> flip -> CHW uint8, batch
256, 2 workers, every batch holding its images and its captions (a list of str). Ours:
``dlpack convert`` (sidecars -> field ``txt``, 2 encode workers) and
``Loader(fields=("image", "txt"))`` with 2 thread workers; WebDataset: tar shards of
.jpg + .txt, shard shuffle + 1000-sample buffer, DataLoader with 2 processes; Streaming:
MDSWriter (bytes + str columns), StreamingDataset(shuffle=True) in a DataLoader with 2
processes. A peer that does not import is skipped with the reason. Rounds interleave the
contenders (order rotating); each store's files are read once (untimed) before its epoch,
so every epoch starts from the page cache (this machine evicts idle pages: PEERS.md).
The peers import with ``streaming.vision``/``streaming.text`` and the two ``transformers``
classes Streaming imports at import time stubbed (no torchvision here).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import types

BATCH, WORKERS, SHARDS = 256, 2, 16


def _stub_peer_imports() -> None:
    """What Streaming imports but this benchmark never uses (torchvision, transformers)."""
    for name in ("streaming.vision", "streaming.text"):
        sys.modules.setdefault(name, types.ModuleType(name))
    if "transformers" not in sys.modules:
        root = types.ModuleType("transformers")
        root.__path__ = []
        for sub, cls in (("feature_extraction_utils", "BatchFeature"),
                         ("tokenization_utils_base", "BatchEncoding")):
            module = types.ModuleType(f"transformers.{sub}")
            setattr(module, cls, type(cls, (dict,), {}))
            sys.modules[f"transformers.{sub}"] = module
        sys.modules["transformers"] = root


def samples(src: str):
    """(key, JPEG bytes, caption) of every image of ``src`` that has a .txt, sorted."""
    for path in sorted(glob.glob(os.path.join(src, "*", "*.jpg"))):
        with open(path, "rb") as f, open(path[:-4] + ".txt", encoding="utf-8") as t:
            yield os.path.relpath(path, src)[:-4].replace("/", "_"), f.read(), t.read()


def _collate(batch) -> tuple:
    import numpy as np
    import torch

    return torch.from_numpy(np.stack([b[0] for b in batch])), [b[1] for b in batch]


class _Work:
    """The shared per-sample work (tools/bench/work.py) on the image; the caption as is."""

    def __call__(self, sample):
        from dlpack_io.tools.bench.work import jpeg_work

        image, caption = sample
        return jpeg_work(image), caption


# ---- ours ----------------------------------------------------------------------------
def ours_write(src: str, out: str) -> None:
    """``dlpack convert`` with its caption sidecars (field ``txt``)."""
    from dlpack_io.packer import convert

    convert(src, out, workers=WORKERS, progress=False, overwrite=True)


def ours_epoch(store: str, seed: int):
    """Our Loader, fields image + txt, RandomResizedCrop(224) + flip on the host."""
    from dlpack_io.reader import Dataset, Loader, RandomHorizontalFlip, RandomResizedCrop

    return Loader(Dataset(store), batch_size=BATCH, num_workers=WORKERS, seed=seed,
                  fields=("image", "txt"),
                  transforms=[RandomResizedCrop(224), RandomHorizontalFlip()])


# ---- WebDataset ------------------------------------------------------------------------
def wds_write(src: str, out: str) -> None:
    """wds.ShardWriter: SHARDS tar shards of .jpg + .txt members."""
    import webdataset as wds

    items = list(samples(src))
    os.makedirs(out, exist_ok=True)
    per = -(-len(items) // SHARDS)
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=per, verbose=0) as sink:
        for key, data, caption in items:
            sink.write({"__key__": key, "jpg": data, "txt": caption})


def wds_epoch(store: str, seed: int):
    """WebDataset with shard shuffle + 1000-sample buffer in a DataLoader."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    urls = sorted(glob.glob(os.path.join(store, "shard-*.tar")))
    dataset = (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, nodesplitter=None,
                              workersplitter=wds.split_by_worker, empty_check=False)
               .shuffle(1000).to_tuple("jpg", "txt").map_tuple(lambda b: b, bytes.decode)
               .map(_Work()).batched(BATCH, collation_fn=_collate))
    return DataLoader(dataset, batch_size=None, num_workers=WORKERS)


# ---- MosaicML Streaming ----------------------------------------------------------------
def mds_write(src: str, out: str) -> None:
    """MDSWriter, uncompressed, columns jpg (bytes) + txt (str)."""
    _stub_peer_imports()
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"jpg": "bytes", "txt": "str"}, size_limit=1 << 26) as sink:
        for _, data, caption in samples(src):
            sink.write({"jpg": data, "txt": caption})


def mds_epoch(store: str, seed: int):
    """StreamingDataset(shuffle=True) over the MDS folder in a DataLoader."""
    _stub_peer_imports()
    import streaming
    from torch.utils.data import DataLoader

    class Captioned(streaming.StreamingDataset):
        def __getitem__(self, idx):
            item = super().__getitem__(idx)
            return _Work()((item["jpg"], item["txt"]))

    streaming.base.util.clean_stale_shared_memory()
    dataset = Captioned(local=store, shuffle=True, shuffle_seed=seed, batch_size=BATCH)
    return DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS, collate_fn=_collate)


def ours():
    """The "fields" section's builder (tools/bench/families.py): (write, loader)."""
    return ours_write, ours_epoch


def webdataset():
    """The "fields" section's builder for WebDataset: (write, loader)."""
    return wds_write, wds_epoch


def streaming():
    """The "fields" section's builder for MosaicML Streaming: (write, loader)."""
    return mds_write, mds_epoch


def _families(only) -> dict:
    from dlpack_io.tools.bench import families

    families.check_only(only, ["fields"])
    return {f.name: f for f in families.select("fields", only)}


def available(family) -> str | None:
    """None when ``family`` can run, else why not (its package does not import)."""
    if family.needs is None:
        return None
    _stub_peer_imports()
    from dlpack_io.tools.bench.peers import peer_status

    status = peer_status(family.needs)
    return None if status["ok"] else status["reason"]


def _builder(name: str):
    from dlpack_io.tools.bench.families import BY_SECTION, build

    return build(BY_SECTION["fields"][name])


def epoch(name: str, store: str, seed: int) -> dict:
    """One whole epoch of contender ``name``, timed from ``iter()`` (worker start and
    first batch included: with workers that prefetch, timing after a warm-up batch would
    count batches made during the warm-up as free), with a check that every batch
    carried one caption per image."""
    loader = _builder(name)[1](store, seed)
    start, n = time.perf_counter(), 0
    for images, captions in loader:
        if len(captions) != len(images) or not isinstance(captions[0], str):
            raise RuntimeError(f"{name}: a batch of {len(images)} images came with "
                               f"{len(captions)} captions")
        n += len(images)
    return {"images_per_s": n / (time.perf_counter() - start), "images": n}


def _warm(store: str) -> None:
    for path in glob.glob(os.path.join(store, "**"), recursive=True):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass


def _one_round(src: str, work: str, names: list, k: int) -> dict:
    out = {}
    for name in names[k % len(names):] + names[:k % len(names)]:  # rotate the order
        store = os.path.join(work, f"{name}-r{k}")
        shutil.rmtree(store, ignore_errors=True)
        t0 = time.perf_counter()
        _builder(name)[0](src, store)
        seconds = time.perf_counter() - t0
        _warm(store)
        child = subprocess.run([sys.executable, "-m", "benchmarks.fields_peers", "--epoch",
                                name, "--store", store, "--seed", str(k)],
                               capture_output=True, text=True)
        if child.returncode:
            raise RuntimeError(f"{name} epoch failed: {child.stderr[-1500:]}")
        out[name] = {"convert_s": seconds, **json.loads(child.stdout.splitlines()[-1])}
        shutil.rmtree(store, ignore_errors=True)
    return out


def run(src: str, work: str, rounds: int, only) -> dict:
    """Interleaved rounds; per contender the medians, and the ratios to ours per round."""
    chosen = _families(only)
    names = list(chosen)
    skipped = {n: why for n, f in chosen.items() if (why := available(f))}
    for n, why in skipped.items():
        print(f"skipping {n}: {why}", file=sys.stderr)
    names = [n for n in names if n not in skipped]
    per_round = [_one_round(src, work, names, k) for k in range(rounds)]
    report = {"skipped": skipped, "rounds": per_round, "median": {}}
    for n in names:
        conv = [r[n]["convert_s"] for r in per_round]
        ips = [r[n]["images_per_s"] for r in per_round]
        report["median"][n] = {"convert_s": statistics.median(conv),
                               "images_per_s": statistics.median(ips)}
        if "ours" in names and n != "ours":
            report["median"][n]["ours_epoch_ratio"] = statistics.median(
                r["ours"]["images_per_s"] / r[n]["images_per_s"] for r in per_round)
            report["median"][n]["ours_convert_ratio"] = statistics.median(
                r["ours"]["convert_s"] / r[n]["convert_s"] for r in per_round)
    return report


def main() -> None:
    """The command line of the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--src", default="/tmp/fields-bench/src")
    p.add_argument("--work", default=None, help="stores go here (default: SRC/../peers)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--only", default=None, help="comma-separated: ours,webdataset,streaming")
    p.add_argument("--epoch", help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.epoch:
        sys.stdout.write(json.dumps(epoch(a.epoch, a.store, a.seed)) + "\n")
        return
    work = a.work or os.path.join(os.path.dirname(os.path.abspath(a.src)), "peers")
    os.makedirs(work, exist_ok=True)
    only = a.only.split(",") if a.only else None
    sys.stdout.write(json.dumps(run(a.src, work, a.rounds, only), indent=1) + "\n")


if __name__ == "__main__":
    main()
