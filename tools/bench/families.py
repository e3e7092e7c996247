"""Every contender family: its label, builder, store per mode, worker range, peer package."""
from __future__ import annotations

from dataclasses import dataclass, field

_B = "dlpack_io.tools.bench."


@dataclass(frozen=True)
class Family:
    """A kind of loader; a Spec picks its mode, workers and batch size."""

    name: str
    label: str
    builder: str                      # "module:function(store, mode, batch_size, workers, seed)"
    stores: dict = field(default_factory=dict)   # mode -> store name
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


FILES = {"jpeg": "files", "raw": "numpy"}
FAMILIES = [
    Family("serial", "serial numpy loop over files", _B + "contenders_basic:serial", FILES,
           max_workers=0),
    Family("multiprocessing", "hand-written multiprocessing loader (per-worker index queues)",
           _B + "contenders_basic:multiprocessing", FILES, min_workers=1),
    Family("dataloader-files", "torch DataLoader over files (PIL)",
           _B + "contenders_torch:dataloader_files", FILES),
    Family("dataloader-lmdb", "torch DataLoader over one LMDB",
           _B + "contenders_torch:dataloader_lmdb", {"jpeg": "lmdb", "raw": "lmdb"}, needs="lmdb"),
    Family("webdataset", "WebDataset (16 tar shards, shard shuffle + 1000 buffer)",
           _B + "contenders_peers:webdataset", {"jpeg": "webdataset", "raw": "webdataset"},
           needs="webdataset"),
    Family("streaming", "MosaicML Streaming (MDS)", _B + "contenders_peers:streaming",
           {"jpeg": "streaming", "raw": "streaming"}, needs="streaming"),
    Family("litdata", "LitData (optimize + StreamingDataLoader)", _B + "contenders_peers:litdata",
           {"jpeg": "litdata", "raw": "litdata"}, needs="litdata"),
    Family("ffcv", "FFCV (own decoder + OpenCV resize; thread workers)",
           _B + "contenders_ffcv:ffcv", {"jpeg": "ffcv", "raw": "ffcv"}, min_workers=1,
           needs="ffcv", same_work=False),
    Family("ours-thread", "ours: dlpack Loader, thread workers", _B + "contenders_ours:ours_thread",
           {"jpeg": "ours-record", "raw": "ours-record"}),
    Family("ours-process", "ours: dlpack Loader, process workers",
           _B + "contenders_ours:ours_process", {"jpeg": "ours-record", "raw": "ours-record"},
           min_workers=1),
]
GPU_FAMILIES = [
    Family("gpu-dataloader", "GPU: DataLoader + .cuda() + torch normalize",
           _B + "contenders_gpu:dataloader_cuda", FILES, device="cuda"),
    Family("gpu-ours", "GPU: ours, device='cuda' (Triton kernels)", _B + "contenders_gpu:ours_cuda",
           {"jpeg": "ours-record", "raw": "ours-record"}, device="cuda"),
]
BY_NAME = {f.name: f for f in FAMILIES + GPU_FAMILIES}
CONVERT_ONLY = [("tar", "jpeg"), ("ours-lmdb", "jpeg"), ("ours-lmdb", "raw")]


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
        return f"{BY_NAME[self.family].stores[self.mode]}-{self.mode}"


def select(only, gpu: bool = False) -> list:
    """The families named in ``only`` (comma list or None: all, plus the GPU ones when ``gpu``)."""
    if not only:
        return list(FAMILIES) + (list(GPU_FAMILIES) if gpu else [])
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise ValueError(f"--only: unknown contender(s) {unknown}; known: {sorted(BY_NAME)}")
    return [BY_NAME[n] for n in names]
