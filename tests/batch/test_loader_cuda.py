"""The Loader's device path on a real GPU, against its CPU twin, and the promises of issue 14.

* Correctness: the CUDA Loader against its CPU twin (``device_transforms=True`` on the CPU:
  the same gathered bytes through the kernels' torch reference), thread and process
  workers, uint8 / float16, ColorJitter, Resize + CenterCrop, EXIF-rotated records,
  sample_transform (host path + pinned copy), on_error="skip"; every CUDA epoch runs with a
  lagging GPU (``torch.cuda._sleep`` on the current stream after each batch, so the host
  runs ahead) while the test holds every batch without copying it: a buffer reused too
  early shows up as a mismatch.
* Promises, measured with torch.profiler (a chrome trace, parsed) and CUDA state: one
  host->device copy per batch (pixels + records), from pinned memory, on a stream that is
  not the kernel's; one Triton kernel per batch; no stream/device synchronisation and no
  device->host copy; batch k+1's copy issued before batch k is yielded and overlapping
  step k on the GPU; device resolution; process slots really pinned (and unpinned on
  close); workers forked after CUDA never touch it; pools and pinned memory kept and
  bounded across epochs; compiled kernel variants bounded while batch geometry changes.
* On the CPU (no GPU): the staging order and the pool bounds run here too (the same
  logic, no copies); the rest is skipped. docs/gpu.md says how a GPU session runs this.
"""
import contextlib
import json
import os
import shutil
import time

import numpy as np
import pytest
import torch

from dlpack_io.reader import (CenterCrop, ColorJitter, Dataset, Loader, Normalize, RandomCrop,
                              RandomHorizontalFlip, RandomResizedCrop, RandomVerticalFlip, Resize,
                              Workers)

from helpers import compiled_variants, pack_jpeg_and_raw

HAVE_CUDA = torch.cuda.is_available()
_needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU (docs/gpu.md)")
cuda = [pytest.mark.gpu, _needs_cuda]  # marks of every CUDA case (pytest -m gpu selects them)


def _cuda_test(fn):
    """Mark a whole test as a CUDA one (the gpu marker, skipped without a device)."""
    return pytest.mark.gpu(_needs_cuda(fn))
LAG_CYCLES = 10_000_000  # torch.cuda._sleep per batch: ~5-7 ms of GPU time at 1.5-2 GHz
FLIPS = [RandomHorizontalFlip(), RandomVerticalFlip()]
JITTER = ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
CORRUPT = (3, 17, 18)  # samples whose JPEG bytes are damaged in the "corrupt" data set


def _exif_folder(root):
    """12 photo-like JPEGs saved with EXIF orientations 1, 3, 6, 8 (6 and 8 are stored
    sideways: the loader must turn them upright at decode time)."""
    from PIL import Image

    from dlpack_io.tools.synth import photo_like

    rng = np.random.default_rng(11)
    for i in range(12):
        exif = Image.Exif()
        exif[0x0112] = (1, 3, 6, 8)[i % 4]
        path = root / f"c{i % 2}" / f"img{i:02d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo_like(rng, 40 + i, 56)).save(path, quality=90, exif=exif)


def _corrupt_copy(src, dst):
    """Copy a record data set and damage (XOR 0xFF) the first 16 payload bytes of CORRUPT."""
    shutil.copytree(src, dst)
    ds = Dataset(dst)
    for i in CORRUPT:
        shard, _ = ds.locate(i)
        _, entry = ds.record(i)
        with open(ds.shards[shard].path, "r+b") as f:
            f.seek(int(entry["offset"]))
            data = bytes(b ^ 0xFF for b in f.read(16))
            f.seek(int(entry["offset"]))
            f.write(data)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from dlpack_io.packer import convert

    root = tmp_path_factory.mktemp("cuda")
    out = pack_jpeg_and_raw(root, 50, 5, seed=4, shard_size="80KB")
    _exif_folder(root / "exif-src")
    out["exif"] = str(root / "exif")
    convert(root / "exif-src", out["exif"], mode="jpeg", shard_size="80KB", workers=1,
            progress=False, overwrite=True)
    kept = {int(o) for s in Dataset(out["exif"]).shards for o in s.index["orientation"]}
    assert kept == {1, 3, 6, 8}  # applied at decode time, by the loader
    out["corrupt"] = str(root / "corrupt")
    _corrupt_copy(out["jpeg"], out["corrupt"])
    return out


def _base(**kw):
    base = dict(batch_size=8, seed=1, drop_last=False, return_index=True, num_workers=2)
    base.update(kw)
    return base


def _lagging_epoch(loader):
    """One CUDA epoch, the GPU kept busy after each batch; every batch held, not copied."""
    held = []
    for batch in loader:
        torch.cuda._sleep(LAG_CYCLES)  # the "training step": the host runs ahead of the GPU
        held.append(batch)
    return held


def _agree(cpu, gpu, dtype, resampled, jitter):
    """Kernel vs torch reference tolerances of docs/kernels.md, over a whole epoch."""
    torch.cuda.synchronize()
    assert len(cpu) == len(gpu)
    diffs = []
    for (a, y1, i1), (b, y2, i2) in zip(cpu, gpu):
        assert np.array_equal(i1, i2) and torch.equal(y1, y2.cpu())
        assert b.is_cuda and b.dtype == a.dtype == dtype and b.shape == a.shape
        diffs.append((a.float() - b.cpu().float()).abs().flatten())
    d = torch.cat(diffs)
    if dtype == torch.uint8 and not (resampled or jitter):
        assert d.max() == 0, "crops without resampling or jitter are exact copies"
    elif dtype == torch.uint8:
        assert d.max() <= 1 and (d > 0).float().mean() <= 0.02, (d.max(), (d > 0).float().mean())
    else:
        assert d.max() <= 2**-9, float(d.max())  # one float16 ulp at |x| < 4


TWINS = {  # id: (data set, transforms, dtype, worker kind)
    "jpeg-rrc-u8-threads": ("jpeg", [RandomResizedCrop(24), *FLIPS], torch.uint8, "thread"),
    "jpeg-rrc-u8-processes": ("jpeg", [RandomResizedCrop(24), *FLIPS], torch.uint8, "process"),
    "raw-crop-u8-threads": ("raw", [RandomCrop(30), *FLIPS], torch.uint8, "thread"),
    "raw-crop-u8-processes": ("raw", [RandomCrop(30), *FLIPS], torch.uint8, "process"),
    "jpeg-jitter-f16-threads": ("jpeg", [RandomResizedCrop(24), FLIPS[0], JITTER, Normalize()],
                                torch.float16, "thread"),
    "raw-jitter-u8-processes": ("raw", [RandomCrop(30), JITTER, FLIPS[1]], torch.uint8,
                                "process"),
    "raw-resize-centercrop-f16-processes": ("raw", [Resize(36), CenterCrop(32), Normalize()],
                                            torch.float16, "process"),
    "jpeg-resize-centercrop-u8-threads": ("jpeg", [Resize(32), CenterCrop(28)], torch.uint8,
                                          "thread"),
    "exif-rrc-f16-threads": ("exif", [RandomResizedCrop(24), *FLIPS, Normalize()],
                             torch.float16, "thread"),
    "exif-crop-u8-processes": ("exif", [RandomCrop(24), *FLIPS], torch.uint8, "process"),
}


@_cuda_test
@pytest.mark.parametrize("case", list(TWINS), ids=list(TWINS))
def test_cuda_loader_matches_its_cpu_twin_with_a_lagging_gpu(packed, case):
    name, transforms, dtype, kind = TWINS[case]
    ds = Dataset(packed[name])
    kw = _base(transforms=transforms, dtype=dtype)
    cpu = [(x.clone(), y, i) for x, y, i in Loader(ds, workers=Workers(device_transforms=True),
                                                   **kw)]
    loader = Loader(ds, device="cuda", workers=Workers(kind=kind), **kw)
    assert loader.device_transforms
    held = _lagging_epoch(loader)
    resampled = any(isinstance(t, (RandomResizedCrop, Resize)) for t in transforms)
    _agree(cpu, held, dtype, resampled, JITTER in transforms)
    loader.set_epoch(1)  # another epoch through the same pools: the held batches stay intact
    assert len(_lagging_epoch(loader)) == len(cpu)
    _agree(cpu, held, dtype, resampled, JITTER in transforms)
    loader.close()


def _quarter_turn(pixels):
    """A user's sample_transform (changes the image's size)."""
    return np.ascontiguousarray(np.rot90(pixels))


HOST_PATHS = {"sample_transform-threads": dict(sample_transform=_quarter_turn),
              "sample_transform-processes": dict(sample_transform=_quarter_turn,
                                                 worker_kind="process"),
              "device_transforms=False-threads": dict(device_transforms=False)}


@_cuda_test
@pytest.mark.parametrize("case", list(HOST_PATHS), ids=list(HOST_PATHS))
def test_host_transforms_to_cuda_are_exact(packed, case):
    """sample_transform (or device_transforms=False, the explicit fallback of issue 14
    item 4) transforms on the host; on CUDA the finished batch is copied from a pinned
    pool: the same bytes as on the CPU, held batches intact under a lagging GPU."""
    ds = Dataset(packed["jpeg"])
    kw = _base(transforms=[RandomResizedCrop(24), FLIPS[0], JITTER, Normalize()],
               dtype=torch.float16, **HOST_PATHS[case])
    cpu = [(x.clone(), y, i) for x, y, i in Loader(ds, **kw)]
    loader = Loader(ds, device="cuda", **kw)
    assert not loader.device_transforms
    held = _lagging_epoch(loader)
    torch.cuda.synchronize()
    assert len(cpu) == len(held)
    for (a, y1, i1), (b, y2, i2) in zip(cpu, held):
        assert np.array_equal(i1, i2) and torch.equal(y1, y2.cpu())
        assert b.is_cuda and torch.equal(a, b.cpu())
    loader.close()


@_cuda_test
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_skip_on_cuda_matches_the_cpu_twin(packed, kind):
    ds = Dataset(packed["corrupt"])
    kw = _base(transforms=[RandomResizedCrop(24), *FLIPS, Normalize()], dtype=torch.float16,
               on_error="skip")
    twin = Loader(ds, workers=Workers(device_transforms=True), **kw)
    cpu = [(x.clone(), y, i) for x, y, i in twin]
    loader = Loader(ds, device="cuda", workers=Workers(kind=kind), **kw)
    held = _lagging_epoch(loader)
    _agree(cpu, held, torch.float16, True, False)
    assert {s.sample for s in loader.skipped} == {s.sample for s in twin.skipped} == set(CORRUPT)
    loader.close()


# ---- staging: batch k+1's copy starts before batch k is yielded -----------------------------
def _wait_built(loader, ticket, deadline=60.0):
    """Hang guard: wait (on the runner's own readiness) until batch ``ticket`` is built."""
    runner = loader._engine.runner
    end = time.monotonic() + deadline
    while not runner.ready(ticket):
        assert time.monotonic() < end, f"batch {ticket} not built within {deadline} s"
        time.sleep(0.002)


def _spy_stage(loader, log):
    """Record (in order) every batch the finisher is asked to stage, by its indices."""
    finisher = loader._engine.finisher
    real = finisher.stage

    def stage(hb):
        log.append(("stage", tuple(hb.indices.tolist())))
        return real(hb)
    finisher.stage = stage


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("staging", [True, False], ids=["staged", "no_staging"])
def test_next_batch_is_staged_before_this_one_is_yielded(packed, device, staging, tmp_path):
    """When batch k+1 is built by the time batch k is due, its copy (on the CPU: its
    hand-over) starts before batch k reaches the training loop; under the step benchmark's
    ``no_staging()`` it starts only when k+1 is due. On CUDA the profiler shows k + 2 (k + 1)
    host->device copies issued before step k begins, copy k+1 running on the GPU before
    step k's work ends (it overlaps the step)."""
    from benchmarks.gpu_step.steps import no_staging

    ds = Dataset(packed["raw"])
    loader = Loader(ds, device=device, workers=Workers(device_transforms=True),
                    **_base(transforms=[RandomCrop(30), *FLIPS], batch_size=4))
    for _ in loader:  # warm-up epoch: kernels compiled, constants on the device
        pass
    loader.set_epoch(1)
    total, log = len(loader), []
    prof = _profiler() if device == "cuda" else contextlib.nullcontext()
    with prof, (contextlib.nullcontext() if staging else no_staging()):
        it = iter(loader)
        first = next(it)
        ticket0 = loader._tickets - total
        _spy_stage(loader, log)
        log.append(("yield", tuple(first[2].tolist())))
        for k in range(1, total):
            if k + 1 < total:
                _wait_built(loader, ticket0 + k + 1)
            _, _, idx = next(it)
            log.append(("yield", tuple(idx.tolist())))
            with torch.profiler.record_function(f"dlpack-test-step-{k}"):
                if device == "cuda":
                    torch.cuda._sleep(LAG_CYCLES)
                    torch.cuda.current_stream().synchronize()  # a step that waits (loss.item())
        assert next(it, None) is None
    batches = [entry for kind, entry in log if kind == "yield"]
    assert total >= 4 and len(batches) == total
    for k in range(1, total - 1):
        early = log.index(("stage", batches[k + 1])) < log.index(("yield", batches[k]))
        assert early == staging, (k, log)
    if device == "cuda":
        _check_overlap(_trace(prof, tmp_path), total, staging)


# ---- profiler: copies, streams, kernels, syncs ------------------------------------------------
def _profiler():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def _trace(prof, tmp_path) -> list:
    """Complete events of the profile's chrome trace (stable across torch versions); a
    copy goes to $DLPACK_TRACE_DIR when set (docs/gpu.md)."""
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    if os.environ.get("DLPACK_TRACE_DIR"):
        os.makedirs(os.environ["DLPACK_TRACE_DIR"], exist_ok=True)
        shutil.copy(path, os.path.join(os.environ["DLPACK_TRACE_DIR"], f"{tmp_path.name}.json"))
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"]


def _cat(e) -> str:
    cat = str(e.get("cat", "")).lower()
    if "memcpy" in cat:
        return "memcpy"
    if cat == "kernel":
        return "kernel"
    if cat in ("cuda_runtime", "runtime", "cuda_driver"):
        return "runtime"
    return "annotation" if cat == "user_annotation" else cat


def _ours(e) -> bool:
    return _cat(e) == "kernel" and ("_crop_flip_permute_kernel" in e["name"]
                                    or "_resized_crop" in e["name"])


def _check_overlap(events, total, staging):
    steps = {int(e["name"].rsplit("-", 1)[1]): e for e in events
             if _cat(e) == "annotation" and e["name"].startswith("dlpack-test-step-")}
    issued = sorted(e["ts"] for e in events
                    if _cat(e) == "runtime" and e["name"].startswith("cudaMemcpyAsync"))
    copies = sorted((e for e in events if _cat(e) == "memcpy" and "HtoD" in e["name"]),
                    key=lambda e: e["ts"])
    spins = sorted((e for e in events if _cat(e) == "kernel" and "spin" in e["name"].lower()),
                   key=lambda e: e["ts"])
    assert len(copies) == len(issued) == total, (len(copies), len(issued), total)
    assert len(spins) == total - 1  # one "step" per batch after the first
    for k in range(1, total - 1):
        assert sum(ts < steps[k]["ts"] for ts in issued) == k + 1 + staging, k
        spin = spins[k - 1]  # step k's GPU work
        overlaps = copies[k + 1]["ts"] < spin["ts"] + spin["dur"]
        assert overlaps == staging, (k, "copy k+1 vs the end of step k")


@_cuda_test
@pytest.mark.parametrize("name,kind", [("raw", "thread"), ("jpeg", "thread"),
                                       ("jpeg", "process")])
def test_one_pinned_side_stream_copy_and_one_kernel_per_batch(packed, name, kind, tmp_path):
    ds = Dataset(packed[name])
    crop = RandomCrop(30) if name == "raw" else RandomResizedCrop(24)
    loader = Loader(ds, device="cuda", workers=Workers(kind=kind), dtype=torch.float16,
                    **_base(transforms=[crop, *FLIPS, Normalize()], return_index=False))
    for _ in loader:  # warm-up epoch: kernels compiled, pools and constants in place
        pass
    torch.cuda.synchronize()
    loader.set_epoch(1)
    with _profiler() as prof:
        count = 0
        for images, labels in loader:
            with torch.profiler.record_function(f"dlpack-test-step-{count}"):
                torch.cuda._sleep(LAG_CYCLES)
            count += 1
        with torch.profiler.record_function("dlpack-test-end"):
            pass
    events = _trace(prof, tmp_path)
    end = max(e["ts"] for e in events
              if _cat(e) == "annotation" and e["name"] == "dlpack-test-end")
    # host calls up to the end of the loop (the profiler's own final sync comes after it);
    # GPU work whenever it ran (the GPU lags behind the host)
    names = sorted({e["name"] for e in events if _cat(e) == "runtime" and e["ts"] < end})
    htod = [e for e in events if _cat(e) == "memcpy" and "HtoD" in e["name"]]
    kernels = [e for e in events if _ours(e)]
    assert len(htod) == count == len(loader), ("one copy per batch", len(htod), count)
    assert all("Pinned" in e["name"] for e in htod), [e["name"] for e in htod]
    assert len(kernels) == count, [e["name"] for e in kernels]
    kernel_streams = {e["args"]["stream"] for e in kernels}
    copy_streams = {e["args"]["stream"] for e in htod}
    assert len(kernel_streams) == 1 and not copy_streams & kernel_streams
    assert not [e for e in events if _cat(e) == "memcpy" and "DtoH" in e["name"]]
    banned = [n for n in names if n.startswith(("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                "cudaMemcpy2D", "cuCtxSynchronize",
                                                "cuStreamSynchronize"))
              or n in ("cudaMemcpy", "cuMemcpy")]
    assert not banned, names
    loader.close()


# ---- device resolution ------------------------------------------------------------------------
@_cuda_test
def test_device_is_resolved_once_explicit_then_local_rank_then_current(packed, monkeypatch):
    ds = Dataset(packed["raw"])
    kw = dict(batch_size=8, transforms=[RandomCrop(30)], num_workers=0)
    last = torch.cuda.device_count() - 1
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert Loader(ds, device=f"cuda:{last}", **kw).device == torch.device("cuda", last)
    with torch.cuda.device(last):
        current = Loader(ds, device="cuda", **kw)
    assert current.device == torch.device("cuda", last)
    monkeypatch.setenv("LOCAL_RANK", str(last))
    assert Loader(ds, device="cuda", **kw).device == torch.device("cuda", last)
    monkeypatch.setenv("LOCAL_RANK", str(last + 1))
    with pytest.raises(RuntimeError, match=rf"device cuda:{last + 1} does not exist: "
                                           rf"{last + 1} GPU\(s\) \(LOCAL_RANK='{last + 1}'\)"):
        Loader(ds, device="cuda", **kw)
    assert Loader(ds, device=f"cuda:{last}", **kw).device.index == last  # explicit wins
    images, labels = next(iter(current))
    assert images.device == labels.device == torch.device("cuda", last)


@_cuda_test
def test_batches_stay_on_the_resolved_gpu_when_another_becomes_current(packed, monkeypatch):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs (LOCAL_RANK=1 while cuda:0 is current)")
    ds = Dataset(packed["jpeg"])
    monkeypatch.setenv("LOCAL_RANK", "1")
    torch.cuda.set_device(0)
    loader = Loader(ds, device="cuda", **_base(transforms=[RandomResizedCrop(24)]))
    monkeypatch.delenv("LOCAL_RANK")
    devices = {(x.device, y.device) for x, y, _ in loader}
    assert devices == {(torch.device("cuda", 1), torch.device("cuda", 1))}


# ---- pinned slots, forked workers, pools across epochs ------------------------------------------
@_cuda_test
def test_process_slots_are_pinned_while_the_loader_lives(packed):
    loader = Loader(Dataset(packed["jpeg"]), device="cuda", workers=Workers(kind="process"),
                    **_base(transforms=[RandomResizedCrop(24)]))
    it = iter(loader)
    next(it)
    slots = [torch.frombuffer(b, dtype=torch.uint8) for b in loader._engine.runner.slot_buffers()]
    assert slots and all(s.is_pinned() for s in slots)  # cudaHostRegister'ed
    for _ in it:
        pass
    loader.close()
    assert not any(s.is_pinned() for s in slots)  # unregistered when the Loader closes
    del slots


def _forked_after_cuda(pixels):
    """A sample_transform (runs in the worker process): checks the test's premise."""
    if not torch.cuda._is_in_bad_fork():
        raise RuntimeError("this worker was not forked after CUDA was initialised")
    return pixels


@_cuda_test
def test_workers_forked_after_cuda_never_touch_it(packed):
    """Worker processes are forked after the parent initialised CUDA (the probe checks it);
    torch raises in such a child on any CUDA call, so every batch arriving proves the
    workers (gathering for the device path, or transforming on the host) never used it."""
    torch.zeros(1, device="cuda")
    assert torch.cuda.is_initialized()
    ds = Dataset(packed["jpeg"])
    host = Loader(ds, device="cuda", workers=Workers(kind="process"),
                  sample_transform=_forked_after_cuda,
                  **_base(transforms=[RandomResizedCrop(24)]))
    device = Loader(ds, device="cuda", workers=Workers(kind="process"),
                    **_base(transforms=[RandomResizedCrop(24)]))
    for loader in (host, device):
        assert sum(len(y) for _, y, _ in loader) == 50
        pids = loader.worker_pids()
        loader.set_epoch(1)
        assert sum(len(y) for _, y, _ in loader) == 50
        assert loader.worker_pids() == pids and len(pids) == 2  # workers kept across epochs
        loader.close()


def _host_stats() -> dict:
    """torch's pinned-memory allocator statistics ({} where this torch has none)."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    return dict(stats()) if stats is not None else {}


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _slot_bound(loader, ds) -> int:
    """docs/loader.md: one slot holds batch_size x the largest stored image + the records,
    allocated 1.25x when it grows (thread workers)."""
    from dlpack_io.reader.batch.build import largest_image

    h, w = largest_image(ds)
    return (loader.options.batch_size * (h * w * 3 + 64) + 8) * 5 // 4


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_thread_pools_are_kept_across_epochs_and_bounded(packed, device):
    ds = Dataset(packed["raw"])  # one record size: each slot is allocated once
    loader = Loader(ds, device=device, workers=Workers(device_transforms=True, prefetch=3),
                    **_base(transforms=[RandomCrop(30), *FLIPS]))
    cuda_ = device == "cuda"
    host = _host_stats if cuda_ and "num_host_alloc" in _host_stats() else None
    before = host()["allocated_bytes.current"] if host else 0
    list(loader)
    engine, pool = loader._engine, loader._engine.job.slots
    slots = [(i, t.data_ptr()) for i, t in enumerate(pool._tensors) if t is not None]
    allocs = host()["num_host_alloc"] if host else 0
    segments = torch.cuda.memory_stats()["segment.all.allocated"] if cuda_ else 0
    for epoch in (1, 2):
        loader.set_epoch(epoch)
        list(loader)
    assert loader._engine is engine
    now = [(i, t.data_ptr()) for i, t in enumerate(pool._tensors) if t is not None]
    assert set(slots) <= set(now) and len(now) <= 3 + 2  # same buffers, prefetch + 2 at most
    assert 0 < pool.nbytes() <= len(now) * _slot_bound(loader, ds)
    if cuda_:
        assert torch.cuda.memory_stats()["segment.all.allocated"] == segments  # no cudaMalloc
    if host:  # torch's pinned allocator (rounds blocks up to powers of two)
        assert 0 <= host()["num_host_alloc"] - allocs <= len(now) - len(slots)
        grown = host()["allocated_bytes.current"] - before
        assert grown <= len(now) * _pow2(_slot_bound(loader, ds))
    loader.close()


def test_ragged_thread_slots_stay_within_the_documented_bound(packed):
    ds = Dataset(packed["jpeg"])  # decoded regions of every size: slots grow on demand
    loader = Loader(ds, workers=Workers(device_transforms=True, prefetch=2),
                    **_base(transforms=[RandomResizedCrop(24)], reduced_decode=False))
    for epoch in range(3):
        loader.set_epoch(epoch)
        list(loader)
    pool = loader._engine.job.slots
    assert 0 < pool.nbytes() <= (2 + 2) * _slot_bound(loader, ds)
    loader.close()


def test_process_slots_are_the_documented_size_and_kept(packed):
    from dlpack_io.reader.batch.build import largest_image

    ds = Dataset(packed["jpeg"])
    loader = Loader(ds, workers=Workers(device_transforms=True, kind="process", prefetch=2),
                    **_base(transforms=[RandomResizedCrop(24)]))
    list(loader)
    runner, pids = loader._engine.runner, loader.worker_pids()
    buffers = runner.slot_buffers()
    h, w = largest_image(ds)
    assert [len(b) for b in buffers] == [8 * (h * w * 3 + 64) + 64] * (2 + 1)
    loader.set_epoch(1)
    list(loader)
    assert loader._engine.runner is runner and loader.worker_pids() == pids
    assert all(a is b for a, b in zip(runner.slot_buffers(), buffers))
    loader.close()


# ---- compiled kernel variants ---------------------------------------------------------------


@_cuda_test
def test_compiled_variants_stay_bounded_as_batch_geometry_changes(packed):
    """Ragged JPEG batches change the buffer length and every image size per batch; those
    are runtime ints (do_not_specialize), so three epochs add at most two variants of the
    kernel: the records' address is 8-byte aligned, and Triton specialises pointers on
    16-byte alignment."""
    from dlpack_io.kernels import resize

    ds = Dataset(packed["jpeg"])
    loader = Loader(ds, device="cuda", dtype=torch.bfloat16,
                    **_base(transforms=[RandomResizedCrop(24), *FLIPS, Normalize()],
                            batch_size=7))
    next(iter(loader))  # jit the kernel (a variant this file's other tests do not use)
    before = compiled_variants(resize._resized_crop_aa_kernel)
    sizes = set()
    for epoch in range(3):
        loader.set_epoch(epoch)
        for x, _, _ in loader:
            sizes.add(x.shape[0])
    assert len(sizes) > 1
    assert compiled_variants(resize._resized_crop_aa_kernel) - before <= 1
    loader.close()


# ---- the step benchmark (benchmarks/gpu_step) ------------------------------------------------
def test_step_benchmark_runs_end_to_end_on_the_cpu(tmp_path, capsys):
    """The GPU session's step benchmark, tiny on the CPU: its logic, not its timings."""
    from benchmarks.gpu_step import main as gpu_step

    out = tmp_path / "step.json"
    assert gpu_step.main(["--cpu-smoke", "--work-dir", str(tmp_path / "data"),
                          "--json", str(out)]) == 0
    assert "| staged |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    summary = report["summary"]
    assert set(summary) == {"resident", "staged", "unstaged"} and report["cpu_smoke"]
    assert all(s["steps"] == 2 and s["step_ms"] > 0 for s in summary.values())
    assert summary["resident"]["exposed_ms"] == 0 and report["device"]
    if not HAVE_CUDA:
        assert gpu_step.main(["--json", str(tmp_path / "no.json")]) == 2
