"""Every contender of every benchmark, in one registry: the only way to define one.

A :class:`Family` names a builder ("module:function", imported only when it runs) and what
it reads in each mode; ``options`` are keyword arguments added to the builder's call, so
variants of one builder (worker kind, worker count, fetch mode, packer option) are entries
here, not wrapper functions. What the builder is called with depends on its section:

=========  ==========================================================================
section    builder call -> result
=========  ==========================================================================
convert    ``f(inputs, out, mode, raw_npy, **options) -> dict`` writes one store
loader     ``f(store, mode, batch_size, workers, seed, **options) -> epoch(n)`` iterator
           of (uint8 NCHW images, labels); a ``close()`` on it is called at the end
remote     ``f(endpoint, out, cache, rank, world_size, **options) -> (loader, dataset)``
s3-client  ``f(env, endpoint, ranges, inflight, **options) -> run()`` fetching ``ranges``
ray        ``f(src, dst, head, **options) -> dict`` (convert()'s result)
ram        ``f(path, mode, crop, batch_size, workers, **options) -> Loader`` (its shards
           mapped; larger_than_ram)
fields     ``f(**options) -> (write(src, out), loader(store, seed))``: an image + caption
           set converted and read by each contender (fields_peers)
=========  ==========================================================================

``reads[mode]`` is the store a family reads in that mode: another convert family's name
("numpy": its decoded arrays), or "src" (the JPEG folder itself); a mode not in ``reads``
is not supported. ``dlpack bench`` runs the convert, loader and remote sections, whose
builders live in this package; ``s3-client`` (``python -m benchmarks.remote_clients``),
``ray`` (``benchmarks.convert_ray``), ``ram`` (``benchmarks.larger_than_ram``) and ``fields``
(``benchmarks.fields_peers``) are run by
the standalone benchmarks of the repository's ``benchmarks/`` folder (not in the wheel), so
their builders name modules there, imported only by those benchmarks.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

_B = "dlpack_io.tools.bench."   # builders of the sections `dlpack bench` runs (in the wheel)
_S = "benchmarks."               # builders of the standalone benchmarks (repository only)
SECTIONS = ("convert", "loader", "remote", "s3-client", "ray", "ram", "fields")
BENCH_SECTIONS = ("convert", "loader", "remote")   # what `dlpack bench --section` runs


@dataclass(frozen=True)
class Family:
    """A kind of contender; for loaders a Spec picks its mode, workers and batch size."""

    name: str
    label: str
    builder: str                      # "module:function", see the table above
    reads: dict                       # mode -> store it reads ("src": the JPEG folder)
    section: str = "loader"
    options: dict = field(default_factory=dict)   # extra keyword arguments of the builder
    min_workers: int = 0
    max_workers: int | None = None    # None: any
    needs: str | None = None          # peer package (see peers.PACKAGES)
    same_work: bool = True            # False: the peer's own transforms, not the PIL work
    device: str = "cpu"

    def worker_counts(self, wanted) -> list:
        """The worker counts of ``wanted`` (plus 0 where it runs in-process) it supports."""
        counts = sorted({0, *wanted})
        top = self.max_workers if self.max_workers is not None else max(counts)
        return [w for w in counts if self.min_workers <= w <= top]


def _loader(name, label, func, reads, **kw) -> Family:
    return Family(name, label, _B + func, reads, "loader", **kw)


def _store(name, label, func, reads, **kw) -> Family:
    return Family(name, label, _B + "stores:" + func, reads, "convert", **kw)


FILES = {"jpeg": "files", "raw": "numpy"}
OURS = {"jpeg": "ours-record", "raw": "ours-record"}
BOTH = {"jpeg": "src", "raw": "src"}
PEER = {"jpeg": "src", "raw": "numpy"}   # the peers' raw stores are written from numpy's arrays
OURS_PACK = "ours: our packer, %s (all cores)"
FAMILIES = [
    # ---- convert: one folder of JPEGs into every contender's format (timed) ----
    _store("files", "the JPEG folder itself", "write_files", {"jpeg": "src"}),
    _store("numpy", "numpy .npy (PIL decode + resize, all cores)", "write_numpy", {"raw": "src"}),
    _store("npy-files", "one .npy file per sample (from the numpy store)", "write_npy_files",
           {"raw": "numpy"}),
    _store("tar", "tar cf", "write_tar", {"jpeg": "src"}),
    _store("ours-record", OURS_PACK % "record shards", "write_ours", BOTH),
    _store("ours-record-1w", "ours: record shards, 1 worker", "write_ours", BOTH,
           options={"workers": 1}),
    _store("ours-record-plain", "ours: record shards without restart markers (all cores)",
           "write_ours", {"jpeg": "src"}, options={"jpeg_restarts": False}),
    _store("ours-record-novalidate", "ours: record shards, no validation (all cores)",
           "write_ours", {"jpeg": "src"}, options={"validate": False}),
    _store("ours-planes", OURS_PACK % "decoded planes (--mode planes)", "write_ours",
           {"jpeg": "src"}, options={"pack_mode": "planes"}),
    _store("ours-lmdb", OURS_PACK % "LMDB shards", "write_ours", BOTH,
           options={"format": "lmdb"}),
    _store("ours-lmdb-1w", "ours: LMDB shards, 1 worker", "write_ours", BOTH,
           options={"format": "lmdb", "workers": 1}),
    _store("lmdb", "plain LMDB (py-lmdb, one txn)", "write_lmdb", PEER, needs="lmdb"),
    _store("webdataset", "webdataset ShardWriter", "write_webdataset", PEER, needs="webdataset"),
    _store("streaming", "streaming MDSWriter", "write_mds", PEER, needs="streaming"),
    _store("litdata", "litdata optimize (all cores)", "write_litdata", PEER, needs="litdata"),
    _store("ffcv", "ffcv DatasetWriter (jpeg: re-encodes q90)", "write_ffcv", PEER, needs="ffcv"),
    # ---- loader: full random-order epochs of the same work ----
    _loader("serial", "serial numpy loop over files", "contenders_basic:serial", FILES,
            max_workers=0),
    _loader("multiprocessing", "hand-written multiprocessing loader (per-worker index queues)",
            "contenders_basic:multiprocessing", FILES, min_workers=1),
    _loader("dataloader-files", "torch DataLoader over files (PIL)",
            "contenders_torch:dataloader_files", FILES),
    _loader("dataloader-npy", "torch DataLoader over one .npy file per sample",
            "contenders_torch:dataloader_npy", {"raw": "npy-files"}),
    _loader("dataloader-ours", "torch DataLoader over our record shards (PIL work)",
            "contenders_torch:dataloader_ours", OURS),
    _loader("dataloader-lmdb", "torch DataLoader over one LMDB",
            "contenders_torch:dataloader_lmdb", {"jpeg": "lmdb", "raw": "lmdb"}, needs="lmdb"),
    _loader("webdataset", "WebDataset (16 tar shards, shard shuffle + 1000 buffer)",
            "contenders_peers:webdataset", {"jpeg": "webdataset", "raw": "webdataset"},
            needs="webdataset"),
    _loader("streaming", "MosaicML Streaming (MDS)", "contenders_peers:streaming",
            {"jpeg": "streaming", "raw": "streaming"}, needs="streaming"),
    _loader("litdata", "LitData (optimize + StreamingDataLoader)", "contenders_peers:litdata",
            {"jpeg": "litdata", "raw": "litdata"}, needs="litdata"),
    _loader("ffcv", "FFCV (own decoder + OpenCV resize; thread workers)",
            "contenders_ffcv:ffcv", {"jpeg": "ffcv", "raw": "ffcv"}, min_workers=1,
            needs="ffcv", same_work=False),
    _loader("ours-thread", "ours: dlpack Loader, thread workers", "contenders_ours:ours", OURS,
            options={"worker_kind": "thread"}),
    _loader("ours-process", "ours: dlpack Loader, process workers", "contenders_ours:ours",
            OURS, options={"worker_kind": "process"}, min_workers=1),
    _loader("ours-plain", "ours: thread workers, records without restart markers",
            "contenders_ours:ours", {"jpeg": "ours-record-plain"},
            options={"worker_kind": "thread"}),
    _loader("ours-planes", "ours: thread workers, decoded planes (--mode planes)",
            "contenders_ours:ours", {"jpeg": "ours-planes"}, options={"worker_kind": "thread"}),
    _loader("gpu-dataloader", "GPU: DataLoader + .cuda() + torch normalize",
            "contenders_gpu:dataloader_cuda", FILES, device="cuda"),
    _loader("gpu-ours", "GPU: ours, device='cuda' (Triton kernels)", "contenders_gpu:ours_cuda",
            OURS, device="cuda"),
]
FAMILIES += [
    # ---- remote: first epoch from S3 (SeaweedFS behind the latency proxy), cold cache ----
    Family("dataloader-1", "DataLoader, one GET per image, one at a time per worker",
           _B + "contenders_remote:dataloader", {"jpeg": "s3-files"}, "remote",
           options={"inflight": 1}, needs="boto3"),
    Family("dataloader-16", "the same, 16 GETs in flight per worker",
           _B + "contenders_remote:dataloader", {"jpeg": "s3-files"}, "remote",
           options={"inflight": 16}, needs="boto3"),
    Family("streaming", "MosaicML Streaming (MDS from the same server)",
           _B + "contenders_remote:streaming", {"jpeg": "s3-mds"}, "remote", needs="streaming"),
    Family("litdata", "LitData (its chunks from the same server)",
           _B + "contenders_remote:litdata", {"jpeg": "s3-litdata"}, "remote", needs="litdata"),
    Family("ours-records", "ours, record fetch (s3://, planner)", _B + "contenders_remote:ours",
           {"jpeg": "s3-ours"}, "remote", options={"fetch_mode": "records"}, needs="obstore"),
    Family("ours-shards", "ours, whole-shard fetch", _B + "contenders_remote:ours",
           {"jpeg": "s3-ours"}, "remote", options={"fetch_mode": "shards"}, needs="obstore"),
    Family("ours-local", "ours on local disk (page cache dropped)", _B + "contenders_remote:local",
           {"jpeg": "ours"}, "remote"),
    # ---- s3-client: many ~100 KB range GETs in flight (remote_clients) ----
    Family("boto3+threads", "boto3, one client, a thread pool", _S + "remote_clients:boto3_fetch",
           {}, "s3-client", needs="boto3"),
    Family("obstore", "obstore, get_range_async under a semaphore",
           _S + "remote_clients:obstore_fetch", {}, "s3-client", needs="obstore"),
    # ---- ray: convert --engine ray against the local engine (convert_ray) ----
    Family("local", "local", _S + "convert_ray.engines:local_engine", {"jpeg": "src"}, "ray"),
    Family("ray-running", "ray, cluster running", _S + "convert_ray.engines:ray_engine",
           {"jpeg": "src"}, "ray", options={"running": True}),
    Family("ray-private", "ray, private cluster", _S + "convert_ray.engines:ray_engine",
           {"jpeg": "src"}, "ray", options={"running": False}),
    # ---- ram: our Loader's epochs under a page cache smaller than the data (larger_than_ram) ----
    # (labels as in docs/benchmarks.md; block 256x16 is the Loader's default geometry)
    Family("global", "global", _S + "larger_than_ram.loader:ram_loader", OURS, "ram",
           options={"shuffle": "global"}),
    Family("block-256x16", "block 256x16", _S + "larger_than_ram.loader:ram_loader",
           OURS, "ram", options={"shuffle": "block", "block_size": 256, "block_window": 16}),
    Family("block-256x4", "block 256x4", _S + "larger_than_ram.loader:ram_loader", OURS, "ram",
           options={"shuffle": "block", "block_size": 256, "block_window": 4}),
    Family("global-madv-random", "global, MADV_RANDOM",
           _S + "larger_than_ram.loader:ram_loader", OURS, "ram",
           options={"shuffle": "global", "advice": "random"}),
    # ---- fields: image + caption sets, convert time and epoch (fields_peers) ----
    Family("ours", "ours: dlpack convert (.txt sidecars) + Loader(fields=('image', 'txt'))",
           _S + "fields_peers:ours", {"jpeg": "src"}, "fields"),
    Family("webdataset", "WebDataset (.jpg + .txt tar shards)", _S + "fields_peers:webdataset",
           {"jpeg": "src"}, "fields", needs="webdataset"),
    Family("streaming", "MosaicML Streaming (MDS: bytes + str columns)",
           _S + "fields_peers:streaming", {"jpeg": "src"}, "fields", needs="streaming"),
]
BY_SECTION = {s: {f.name: f for f in FAMILIES if f.section == s} for s in SECTIONS}
QUICK_CONVERT = ("files", "numpy", "tar", "ours-record", "ours-lmdb", "lmdb", "webdataset",
                 "streaming", "litdata", "ffcv")   # --quick: no worker-count / option variants


@dataclass(frozen=True)
class Spec:
    """One loader configuration, run in its own process."""

    family: str
    mode: str
    workers: int
    batch_size: int

    @property
    def name(self) -> str:
        """e.g. 'webdataset jpeg w2 b256'."""
        return f"{self.family} {self.mode} w{self.workers} b{self.batch_size}"

    @property
    def store(self) -> str:
        """The folder name of the store it reads: '<store>-<mode>'."""
        return f"{BY_SECTION['loader'][self.family].reads[self.mode]}-{self.mode}"


def names(only) -> list:
    """``--only`` as a list of names (comma string, list, or None: [])."""
    if not only:
        return []
    items = only.split(",") if isinstance(only, str) else only
    return [n.strip() for n in items if n.strip()]


def check_only(only, sections) -> None:
    """ValueError naming every ``--only`` name that no family of ``sections`` has."""
    known = sorted({n for s in sections for n in BY_SECTION[s]})
    unknown = [n for n in names(only) if n not in known]
    if unknown:
        raise ValueError(f"--only: unknown contender(s) {unknown} in section(s) "
                         f"{','.join(sections)}; known: {known}")


def select(section: str, only=None, gpu: bool = False) -> list:
    """The families of ``section`` named in ``only`` (None: all; the CUDA ones only when
    ``gpu``). A name of another section is ignored here (see check_only)."""
    if section not in BY_SECTION:
        raise ValueError(f"unknown section {section!r}; known: {', '.join(SECTIONS)}")
    wanted = names(only)
    if wanted:
        return [BY_SECTION[section][n] for n in wanted if n in BY_SECTION[section]]
    return [f for f in BY_SECTION[section].values() if gpu or f.device == "cpu"]


def resolve(family: Family):
    """The builder function of ``family`` (imports its module)."""
    module, func = family.builder.split(":")
    return getattr(importlib.import_module(module), func)


def build(family: Family, *args, **extra):
    """Call the builder of ``family`` with its section's arguments, its options and ``extra``
    (keyword arguments every family of a run gets, e.g. the Ray benchmark's shard size)."""
    return resolve(family)(*args, **family.options, **extra)
