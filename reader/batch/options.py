"""The Loader's options: each written once here, with its default and its one-line doc.

``Loader(ds, ...)`` takes the options most scripts set as keywords (:class:`LoaderOptions`'
own fields) and the rest in three small typed groups whose names say what they govern:

* ``order=Order(...)``: which samples an epoch reads beyond shuffle, seed and drop_last
  (a subset, the geometry of ``shuffle="block"``);
* ``workers=Workers(...)``: who builds the batches and how (thread or process workers, or
  Ray actors on a cluster; batches in flight, timeout, unreadable samples, where the
  transforms run);
* ``output=Output(...)``: what each delivered batch holds and how (indices, padding,
  pinned memory).

The Loader's signature, ``help(Loader)`` (:data:`OPTION_DOCS`) and docs/loader.md's table are
made from the dataclass fields below; nothing else restates a default. DataLoader's own
names keep their meaning (``timeout``, ``pin_memory``, ``persistent_workers``,
``prefetch_factor``) and the names of earlier releases keep working with a
DeprecationWarning naming the new spelling: both are mapped in :data:`DATALOADER_NAMES` and
:data:`LEGACY_NAMES` (:func:`options_from`), the one place that knows them.

Also what the Loader resolves once at construction: the device (an explicit index, else
``LOCAL_RANK``, else the current CUDA device) and where the transforms run.
"""
from __future__ import annotations

import difflib
import importlib.util
import os
import warnings
from dataclasses import MISSING, dataclass, field, fields, replace

from dlpack_io.reader.batch import order as order_mod
from dlpack_io.reader.batch.buckets import check_buckets
from dlpack_io.reader.batch.errors import check_on_error
from dlpack_io.reader.batch.plan import check_pad
from dlpack_io.reader.batch.stats import parse_log_every

WORKER_KINDS = ("thread", "process", "ray")
MAX_PREFETCH, MAX_WORKERS = 4096, 1024  # beyond these: a typo, not a setting
AUTO = "auto"  # num_workers / prefetch: settled by measuring the first batches (autotune.py)


def _opt(default, doc: str, factory=None):
    """A dataclass field with its one-line doc (what OPTION_DOCS and docs/loader.md show)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Order:
    """Which samples an epoch reads, beyond ``shuffle``, ``seed`` and ``drop_last``."""

    indices: object = _opt(None, "read only these global sample indices (a split); a torch "
                                 "Subset of the data set does the same")
    block_size: int = _opt(order_mod.DEFAULT_BLOCK_SIZE,
                           'records per block of shuffle="block" (a contiguous run of one '
                           'shard)')
    block_window: int = _opt(order_mod.DEFAULT_WINDOW,
                             'blocks shuffled together by shuffle="block"')


@dataclass(frozen=True)
class Workers:
    """Who builds the batches, and how."""

    kind: str = _opt("thread", '"thread" or "process" workers, or "ray" actors on a Ray '
                               'cluster (num_workers of them)')
    prefetch: object = _opt(None, 'batches in flight; None: 2 x num_workers (at least 2); '
                                  '"auto": measured with num_workers')
    timeout: float | None = _opt(None, "seconds to wait for one batch before LoaderTimeout; "
                                       "None (or 0) waits")
    persistent: bool = _opt(True, "keep the workers from one epoch to the next (False: stop "
                                  "them after each, DataLoader's persistent_workers=False)")
    on_error: str = _opt("raise", '"raise" a SampleError for an unreadable sample, or '
                                  '"skip" it (loader.skipped lists them)')
    device_transforms: bool | None = _opt(None, "where the transforms run: None: the GPU "
                                                "kernels for CUDA, else the host; False: the "
                                                "host; True: the kernels' path")
    reduced_decode: bool = _opt(True, "decode JPEGs at a reduced DCT scale where a resize "
                                      "allows it")
    log_every: object = _opt(None, 'write str(loader.stats()) through logging every N '
                                   'batches (an int) or every so many seconds ("30s"); None: '
                                   'never')
    ray_address: str | None = _opt(None, 'kind="ray": the cluster (HOST:PORT of `ray start '
                                         '--head`, "auto" or ray://...); None: RAY_ADDRESS, '
                                         'else a local one')
    ray_options: dict | None = _opt(None, 'kind="ray": Ray options of each actor (num_cpus, '
                                          'resources, scheduling_strategy, runtime_env, ...)')

    def __post_init__(self):
        if self.kind not in WORKER_KINDS:
            raise ValueError(f"Workers(kind={self.kind!r}): expected one of {WORKER_KINDS}")
        check_ray(self)
        if isinstance(self.prefetch, str) and self.prefetch != AUTO:
            raise ValueError(f"prefetch={self.prefetch!r}: expected a count or {AUTO!r}")
        if self.prefetch not in (None, AUTO) and not 1 <= int(self.prefetch) <= MAX_PREFETCH:
            raise ValueError(f"prefetch {self.prefetch}: expected 1 to {MAX_PREFETCH} batches")
        if self.timeout == 0:  # DataLoader's "wait forever"
            object.__setattr__(self, "timeout", None)
        if self.timeout is not None and not float(self.timeout) > 0:
            raise ValueError(f"timeout {self.timeout}: expected seconds > 0, or None (or 0)")
        check_on_error(self.on_error)
        parse_log_every(self.log_every)


@dataclass(frozen=True)
class Output:
    """What each delivered batch holds besides its fields, and how it is handed over."""

    return_index: bool = _opt(False, "also yield each batch's global sample indices (last)")
    pad: bool = _opt(False, "pad each batch to its largest image (e.g. Resize(800, "
                            "max_size=1333) without a crop) and also yield the true (height, "
                            "width) of each, an int64 (B, 2) tensor after the fields")
    pad_multiple: int = _opt(1, "round each padded side up to a multiple of this (32 for most "
                                "detection backbones)")
    mask_pad_value: int = _opt(255, 'the "mask" field\'s padding (255, the usual ignore '
                                    'index)')
    pin_memory: bool = _opt(False, "CPU batches in page-locked memory (DataLoader's "
                                   "pin_memory)")

    def __post_init__(self):
        check_pad(self.pad, self.pad_multiple, self.mask_pad_value)


# Ray runs the actors; these are ours to set (one batch at a time, replaced when lost).
RAY_MANAGED = ("max_restarts", "max_task_retries", "max_concurrency", "concurrency_groups",
               "lifetime", "name", "namespace", "get_if_exists")


def check_ray(w: Workers) -> None:
    """The Ray settings of ``w``: only with kind="ray", an address a string, the actor
    options a dict without the ones the Loader sets itself."""
    given = [n for n in ("ray_address", "ray_options") if getattr(w, n) is not None]
    if given and w.kind != "ray":
        raise ValueError(f"Workers({given[0]}=...) applies to kind='ray' only (kind is "
                         f"{w.kind!r}): drop it or pass kind='ray'")
    if w.ray_address is not None and not isinstance(w.ray_address, str):
        raise TypeError(f"Workers(ray_address={w.ray_address!r}): expected a string such as "
                        f"'head-node:6379', 'auto' or 'ray://head-node:10001'")
    if w.ray_options is None:
        return
    if not isinstance(w.ray_options, dict):
        raise TypeError(f"Workers(ray_options={w.ray_options!r}): expected a dict of Ray actor "
                        f"options, e.g. {{'num_cpus': 1, 'scheduling_strategy': 'SPREAD'}}")
    managed = sorted(set(w.ray_options) & set(RAY_MANAGED))
    if managed:
        raise ValueError(f"Workers(ray_options=...) sets {', '.join(managed)}: the Loader sets "
                         f"these itself (one batch at a time per actor, lost actors replaced "
                         f"by new ones); leave them out")


GROUPS = {"order": Order, "workers": Workers, "output": Output}


@dataclass(frozen=True)
class LoaderOptions:
    """Every Loader option with its default: the keywords, then the three groups."""

    batch_size: int = _opt(256, "samples per batch")
    shuffle: object = _opt("global", '"global"/True (a full permutation), "block" '
                                     '(shard-local, for data sets larger than RAM), '
                                     'False/None/"none" (storage order)')
    seed: int = _opt(0, "seeds the order and the random transforms")
    num_workers: int = _opt(2, 'worker threads, processes or Ray actors; 0 builds batches in '
                               'the calling thread; "auto": measured on the first batches '
                               '(count and kind)')
    drop_last: bool = _opt(False, "as torch's DataLoader: True drops each rank's short last "
                                  "batch")
    transforms: tuple = _opt((), "the fused transforms (RandomResizedCrop, ..., Normalize), in "
                                 "order")
    sample_transform: object = _opt(None, "your fn(HWC uint8 ndarray) -> HWC uint8 ndarray, run "
                                          "in the workers before transforms")
    dtype: object = _opt(None, "torch.uint8 (default) or float16/bfloat16/float32 (float32 "
                               "with Normalize)")
    device: object = _opt("cpu", 'where batches are delivered; "cuda" means cuda:LOCAL_RANK '
                                 'under torchrun')
    fields: tuple = _opt(("image", "label"), 'what each batch holds, in order: "image", "label" '
                                             'and the data set\'s fields (ds.fields)')
    rank: int | None = _opt(None, "this process's share; None: torch.distributed's, else "
                                  "torchrun's RANK")
    world_size: int | None = _opt(None, "ranks sharing each epoch; None: as rank")
    buckets: object = _opt(None, "batches of every shape: AspectBuckets(...) (each batch one "
                                 "aspect bucket) or TokenBudget(...) (batches filled up to a "
                                 "token budget, padded); None: transforms give one size")
    order: Order = _opt(None, "Order(indices, block_size, block_window)", factory=Order)
    workers: Workers = _opt(None, "Workers(kind, prefetch, timeout, persistent, on_error, "
                                  "device_transforms, reduced_decode, log_every, ray_address, "
                                  "ray_options)",
                            factory=Workers)
    output: Output = _opt(None, "Output(return_index, pad, pad_multiple, mask_pad_value, "
                                "pin_memory)", factory=Output)

    def __post_init__(self):
        for name, cls in GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"{name}={getattr(self, name)!r}: expected a {cls.__name__}"
                                f"(...) (from dlpack_io.reader import {cls.__name__})")
        if isinstance(self.num_workers, str) and self.num_workers != AUTO:
            raise ValueError(f"num_workers={self.num_workers!r}: expected a count or {AUTO!r}")
        if int(self.batch_size) < 1 or self.worker_count < 0 or int(self.seed) < 0:
            raise ValueError(f"batch_size {self.batch_size} must be >= 1, num_workers "
                             f"{self.num_workers} >= 0, seed {self.seed} >= 0")
        if self.workers.kind == "ray" and AUTO in (self.num_workers, self.workers.prefetch):
            raise ValueError("num_workers / prefetch 'auto' measures thread and process workers "
                             "on this machine; give Ray workers a count (num_workers=N actors, "
                             "prefetch=batches in flight)")
        if self.worker_count > MAX_WORKERS:  # each is a thread or process, each has buffers
            raise ValueError(f"num_workers {self.num_workers}: expected at most {MAX_WORKERS}")
        if self.sample_transform is not None and not callable(self.sample_transform):
            raise TypeError(f"sample_transform {self.sample_transform!r} is not callable")
        if not isinstance(self.transforms, (list, tuple)):
            raise TypeError(f"transforms must be a list of transforms, got {self.transforms!r}")
        object.__setattr__(self, "transforms", tuple(self.transforms))
        object.__setattr__(self, "shuffle", order_mod.check_shuffle(self.shuffle))
        check_buckets(self.buckets)

    @property
    def pad_stride(self) -> int:
        """0 without ``pad``, else the multiple each padded side is rounded up to (a token
        budget pads to its patch)."""
        o = self.output
        stride = check_pad(o.pad, o.pad_multiple, o.mask_pad_value)
        patch = getattr(self.buckets, "patch", 0)
        return max(stride, patch) if patch else stride

    @property
    def worker_count(self) -> int:
        """num_workers as a count ("auto": the most it may settle on, MAX_WORKERS)."""
        return MAX_WORKERS if self.num_workers == AUTO else int(self.num_workers)

    @property
    def in_flight(self) -> int:
        """Batches submitted ahead of the one being consumed ("auto": a bound until the
        Loader has settled the setting; autotune.py)."""
        workers = 1 if self.num_workers == AUTO else int(self.num_workers)
        prefetch = self.workers.prefetch
        return max(2, 2 * workers) if prefetch in (None, AUTO) else int(prefetch)

    def with_setting(self, num_workers: int, kind: str, prefetch) -> "LoaderOptions":
        """These options with another worker setting (what num_workers="auto" tries)."""
        return replace(self, num_workers=num_workers,
                       workers=replace(self.workers, kind=kind, prefetch=prefetch))


# ---- names from DataLoader and from earlier releases -------------------------------------
# DataLoader's names that mean what they say there: accepted as they are.
DATALOADER_NAMES = {"timeout": ("workers", "timeout"), "pin_memory": ("output", "pin_memory"),
                    "persistent_workers": ("workers", "persistent")}
# The keywords of earlier releases -> (group, field): accepted with a DeprecationWarning.
LEGACY_NAMES = {"indices": ("order", "indices"), "block_size": ("order", "block_size"),
                "block_window": ("order", "block_window"), "worker_kind": ("workers", "kind"),
                "prefetch": ("workers", "prefetch"), "on_error": ("workers", "on_error"),
                "device_transforms": ("workers", "device_transforms"),
                "reduced_decode": ("workers", "reduced_decode"),
                "log_every": ("workers", "log_every"),
                "return_index": ("output", "return_index"), "pad": ("output", "pad"),
                "pad_multiple": ("output", "pad_multiple"),
                "mask_pad_value": ("output", "mask_pad_value")}
# DataLoader keyword -> what to pass to Loader instead (why it has no direct meaning here)
DATALOADER_ONLY = {
    "sampler": "order=Order(indices=[...]) (the global sample indices to read; the order is "
               "then shuffled by shuffle= and seed=, and split across ranks by the Loader)",
    "batch_sampler": "batch_size= with order=Order(indices=...) (batches are planned by the "
                     "Loader, a pure function of seed, epoch, rank and world size)",
    "collate_fn": "sample_transform= for per-sample code, or your own code on the yielded "
                  "tensors (a batch is built in one buffer, never collated from a list of "
                  "samples)",
    "worker_init_fn": "sample_transform= for per-sample code in the workers (set up what it "
                      "needs lazily, on its first call in each worker)",
    "generator": "seed= (the order and the random transforms are a pure function of seed and "
                 "epoch)",
    "multiprocessing_context": "workers=Workers(kind='process') (workers are forked by the "
                               "Loader), Workers(kind='thread') (the default) or "
                               "Workers(kind='ray')",
    "pin_memory_device": "device='cuda:N' (batches are delivered on that device)",
    "in_order": "nothing: batches always come in order",
}


def _refuse(name: str) -> None:
    if name in DATALOADER_ONLY:
        raise TypeError(f"Loader() does not take DataLoader's {name}=: use "
                        f"{DATALOADER_ONLY[name]} (docs/loader.md, 'Coming from DataLoader')")
    known = [f.name for f in fields(LoaderOptions)] + list(DATALOADER_NAMES) + \
        ["prefetch_factor"] + list(LEGACY_NAMES)
    close = difflib.get_close_matches(name, known, n=2)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise TypeError(f"Loader() got an unexpected keyword argument {name!r}{hint}")


def _default(cls, name: str):
    f = next(f for f in fields(cls) if f.name == name)
    return f.default if f.default is not MISSING else f.default_factory()


def options_from(given: dict, extra: dict, stacklevel: int = 3) -> LoaderOptions:
    """The LoaderOptions of a Loader called with ``given`` (its own keywords, groups None
    when not passed) and ``extra`` (every other keyword: DataLoader's names, the legacy
    ones, ``prefetch_factor``, ``options=``); TypeError for a keyword that is none of
    those, or for one setting given twice."""
    extra = dict(extra)
    if "options" in extra:
        options = extra.pop("options")
        warnings.warn("Loader(options=LoaderOptions(...)) is deprecated: pass the options "
                      "as keywords (Loader(ds, **vars(options)) keeps them)",
                      DeprecationWarning, stacklevel=stacklevel)
        if options is not None:
            if extra or any(k in GROUPS and v is not None or
                            k not in GROUPS and v != _default(LoaderOptions, k)
                            for k, v in given.items()):
                raise TypeError("pass either options=LoaderOptions(...) or keyword options, "
                                "not both")
            return options
    groups = {name: {} for name in GROUPS}
    for name, value in extra.items():
        if name in LEGACY_NAMES:
            group, key = LEGACY_NAMES[name]
            warnings.warn(f"Loader({name}=...) is deprecated: use Loader({group}="
                          f"{GROUPS[group].__name__}({key}=...))", DeprecationWarning,
                          stacklevel=stacklevel)
        elif name in DATALOADER_NAMES:
            group, key = DATALOADER_NAMES[name]
        elif name == "prefetch_factor":
            group, key, value = "workers", "prefetch", _per_worker(value, given, extra)
        else:
            _refuse(name)
        groups[group][key] = value
    for name, cls in GROUPS.items():
        if not groups[name]:
            continue
        asked = given.get(name)
        if asked is None:
            given[name] = cls(**groups[name])
            continue
        twice = [k for k in groups[name] if getattr(asked, k) != _default(cls, k)]
        if twice:
            raise TypeError(f"{name}={asked!r} and the keyword for its {twice[0]}: pass each "
                            f"setting once (inside {cls.__name__}(...))")
        given[name] = replace(asked, **groups[name])
    return LoaderOptions(**{k: v for k, v in given.items() if v is not None or
                            k not in GROUPS})


def _per_worker(factor, given: dict, extra: dict) -> int:
    """DataLoader's ``prefetch_factor`` (batches in flight per worker) as ``prefetch``."""
    workers = given.get("num_workers", _default(LoaderOptions, "num_workers"))
    if "prefetch" in extra or (given.get("workers") is not None and
                               given["workers"].prefetch is not None):
        raise ValueError(f"prefetch and prefetch_factor={factor}: pass one (prefetch counts "
                         f"batches in flight in all, prefetch_factor per worker, as "
                         f"DataLoader's)")
    if workers == AUTO:
        raise ValueError(f"prefetch_factor={factor} with num_workers='auto': the worker count "
                         f"is not known yet; pass workers=Workers(prefetch='auto') (or a "
                         f"count of batches in flight)")
    if int(factor) < 1:
        raise ValueError(f"prefetch_factor {factor}: expected >= 1 batches per worker")
    total = int(factor) * max(1, int(workers))
    if total > MAX_PREFETCH:
        raise ValueError(f"prefetch_factor {factor} x {workers} workers = {total} batches in "
                         f"flight: expected at most {MAX_PREFETCH}")
    return total


def _doc_lines(cls, prefix: str = "") -> list[str]:
    lines = []
    for f in fields(cls):
        default = f.default if f.default is not MISSING else f"{f.type}()"
        lines.append(f"    {prefix}{f.name} = {default!r}: {f.metadata['doc']}."
                     if f.name not in GROUPS else f"    {f.name}: {f.metadata['doc']}.")
    return lines


def option_docs() -> str:
    """``help(Loader)``'s list of options, made from the fields' defaults and docs."""
    lines = ["", "    Options (keyword-only; docs/loader.md has the long form):", ""]
    lines += _doc_lines(LoaderOptions)
    for name, cls in GROUPS.items():
        lines += ["", f"    {name}={cls.__name__}(...): {cls.__doc__}"]
        lines += _doc_lines(cls, prefix=f"{cls.__name__}.")
    lines += ["", "    DataLoader's names keep their meaning: " +
              ", ".join(f"{k} (= {g}.{n})" for k, (g, n) in DATALOADER_NAMES.items()) +
              ", prefetch_factor (batches in flight per worker). Earlier releases' "
              "keywords still work, with a DeprecationWarning: " + ", ".join(LEGACY_NAMES) +
              ".", ""]
    return "\n".join(lines)


OPTION_DOCS = option_docs()


# ---- resolved once, when the Loader is built ---------------------------------------------
def resolve_device(device):
    """The torch.device batches are delivered on, fixed once: ``cuda`` without an index
    means ``LOCAL_RANK`` (torchrun) if set, else the current device. Raises when CUDA is
    asked for and not available."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} but CUDA is not available here (torch "
                           f"{torch.__version__}); use device='cpu'")
    if dev.index is None:
        local = os.environ.get("LOCAL_RANK")
        if local not in (None, "") and not local.strip().isdigit():
            raise ValueError(f"device={device!r}: LOCAL_RANK={local!r} is not a GPU index; "
                             f"torchrun sets it to 0, 1, ...; pass device='cuda:N' to choose")
        dev = torch.device("cuda", int(local) if local not in (None, "") else
                           torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise RuntimeError(f"device {dev} does not exist: {torch.cuda.device_count()} GPU(s) "
                           f"(LOCAL_RANK={os.environ.get('LOCAL_RANK')!r})")
    return dev


def use_device_transforms(choice, device) -> bool:
    """Where the transforms run: the GPU kernels for CUDA (Triton required unless the
    caller asks for host transforms), the host otherwise; ``True`` forces the kernels'
    path (on the CPU: their torch reference, or Triton's interpreter)."""
    if choice is not None:
        return bool(choice)
    if device.type != "cuda":
        return False
    if importlib.util.find_spec("triton") is None:
        raise RuntimeError("device='cuda' finishes batches with Triton kernels, but triton is "
                           "not installed: pip install 'dlpack-io[gpu]' (or triton), or pass "
                           "workers=Workers(device_transforms=False) to transform on the CPU "
                           "and copy the finished batches")
    return True
